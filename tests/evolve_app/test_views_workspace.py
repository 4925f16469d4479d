"""The workspace at any tag (every file, the diff between any two tags), runs named by their
number, and the start form's registered engines and benchmarks: real demo agents, real
evolution runs, real git tags, the personas of tests/conftest.py."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from evolve_app import services
from evolve_app.benchmarks import benchmark_names
from evolve_app.engines import engine_names
from evolve_app.models import EvolutionRun
from tests.evolve_app.helpers import git
from tests.helpers import login, text_of

pytestmark = pytest.mark.django_db(transaction=True)


def run_inline(user, agent, cycles: int = 2, **config):
    run = services.evolution_run_start(user, agent, cycles=cycles, config=config, enqueue=False)
    return services.evolution_run_execute(run.pk)


@pytest.fixture
def finished_run(personas, demo_agent):
    """Two cycles of the textbook engine on the demo: tags evo-0, pre-evo-1, evo-1, pre-evo-2, evo-2."""
    return run_inline(personas.owner, demo_agent, cycles=2)


def commit_and_tag(path: str, files: dict[str, str | bytes], tag: str) -> None:
    """A person's own commit in the workspace, with a tag that is not a snapshot's."""
    for relative, content in files.items():
        target = Path(path) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", f"for {tag}")
    git(path, "tag", tag)


def patch_of(page: str) -> str:
    data = re.search(r'<script id="patch-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(data.group(1))


# --- the diff between two tags ----------------------------------------------------------------------

def test_the_diff_between_two_chosen_tags_shows_the_changed_lines(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    page = text_of(client.get(f"/agents/{agent.pk}/"))
    form = re.search(r'<form method="get" action="/agents/\d+/compare/#diff".*?</form>', page, re.S).group(0)
    for tag in ("HEAD", "evo-2", "pre-evo-2", "evo-1", "pre-evo-1", "evo-0"):
        assert f'value="{tag}"' in form  # both selects offer every snapshot
    response = client.get(f"/agents/{agent.pk}/compare/", {"base": "evo-0", "head": "evo-2"})
    assert response.status_code == 200
    page = text_of(response)
    patch = patch_of(page)
    expected = git(agent.path, "diff", "--no-color", "evo-0", "evo-2")
    assert "+++ b/skills/date-arithmetic/SKILL.md" in patch
    assert "+++ b/skills/string-transforms/SKILL.md" in patch
    added = [line for line in expected.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added and all(line in patch for line in added)
    assert 'data-patch-source="patch-data"' in page and "vendor/diff2html/diff2html-ui-base.min.js" in page
    assert "skills/string-transforms/SKILL.md" in re.search(r'<ul class="list compare-files">.*?</ul>',
                                                            page, re.S).group(0)
    backwards = patch_of(text_of(client.get(f"/agents/{agent.pk}/compare/",
                                            {"base": "evo-2", "head": "evo-0"})))
    assert "--- a/skills/string-transforms/SKILL.md" in backwards and "+++ /dev/null" in backwards


def test_any_tag_of_the_workspace_can_be_compared_not_only_snapshots(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    commit_and_tag(agent.path, {"prompts/system.md": "You answer in one line.\n"}, "my-prompt")
    agent_page = text_of(client.get(f"/agents/{agent.pk}/"))
    form = re.search(r'<div id="compare">.*?</form>', agent_page, re.S).group(0)
    assert form.count('<option value="my-prompt"') == 2  # offered as either end
    page = text_of(client.get(f"/agents/{agent.pk}/compare/", {"base": "evo-2", "head": "my-prompt"}))
    patch = patch_of(page)
    assert "+You answer in one line." in patch and "+++ b/prompts/system.md" in patch
    assert "1 file changed" in page
    same = text_of(client.get(f"/agents/{agent.pk}/compare/", {"base": "evo-1", "head": "evo-1"}))
    assert "no changes" in same


def test_a_tag_that_is_not_there_is_named_on_the_compare_form(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    for bad in ("evo-99", "--output=/tmp/compare-pwned", "HEAD~1", "refs/heads/../../x"):
        response = client.get(f"/agents/{agent.pk}/compare/", {"base": bad, "head": "evo-1"})
        assert response.status_code == 400, bad
        assert f"There is no tag called “{bad}” in this workspace." in text_of(response)
        assert 'id="patch-data"' not in text_of(response)
    assert not Path("/tmp/compare-pwned").exists()
    assert login(personas.outsider).get(f"/agents/{agent.pk}/compare/",
                                        {"base": "evo-0", "head": "evo-1"}).status_code == 404


# --- every file at any tag --------------------------------------------------------------------------

def test_the_prompt_manifest_and_tools_can_be_read_at_any_tag(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    commit_and_tag(agent.path, {"prompts/system.md": "Answer <b>briefly</b> & exactly.\n",
                                "prompts/fragments/style.md": "Be terse.\n"}, "terse")
    top = text_of(client.get(f"/agents/{agent.pk}/files/", {"ref": "evo-0"}))
    for name in ("manifest.yaml", "prompts/", "skills/", "memory/", "tools/"):
        assert f"<code>{name}</code>" in top, name
    files = f"/agents/{agent.pk}/files/"
    original = git(agent.path, "show", "evo-0:prompts/system.md")
    at_start = text_of(client.get(files, {"ref": "evo-0", "path": "prompts/system.md"}))
    assert original.splitlines()[0] in at_start
    later = client.get(files, {"ref": "terse", "path": "prompts/system.md"}).content.decode()
    assert "Answer &lt;b&gt;briefly&lt;/b&gt; &amp; exactly." in later and "<b>briefly</b>" not in later
    folder = text_of(client.get(f"/agents/{agent.pk}/files/", {"ref": "terse", "path": "prompts/fragments"}))
    assert "<code>style.md</code>" in folder
    manifest = text_of(client.get(f"/agents/{agent.pk}/files/", {"ref": "evo-1", "path": "manifest.yaml"}))
    assert "evolvable_layers" in manifest
    tool = text_of(client.get(f"/agents/{agent.pk}/files/", {"ref": "HEAD", "path": "tools/solve.py"}))
    assert git(agent.path, "show", "HEAD:tools/solve.py").splitlines()[0] in tool
    assert f'href="/agents/{agent.pk}/file/?ref=HEAD&path=tools/solve.py" download' in tool
    assert client.get(f"/agents/{agent.pk}/file/", {"ref": "terse", "path": "prompts/fragments/style.md"}
                      ).content == b"Be terse.\n"


def test_binary_and_oversized_files_are_named_not_shown(personas, finished_run, monkeypatch):
    agent, client = finished_run.agent, login(personas.member)
    commit_and_tag(agent.path, {"tools/model.bin": b"\x00\x01binary\x00" * 10,
                                "memory/big.jsonl": '{"lesson": "x"}\n' * 100}, "blobs")
    binary = text_of(client.get(f"/agents/{agent.pk}/files/", {"ref": "blobs", "path": "tools/model.bin"}))
    assert "A binary file" in binary and "binary\x00" not in binary and 'class="file-text"' not in binary
    monkeypatch.setattr("evolve_app.workspace.MAX_FILE_BYTES", 1000)
    big = text_of(client.get(f"/agents/{agent.pk}/files/", {"ref": "blobs", "path": "memory/big.jsonl"}))
    assert "too large to show here" in big and '"lesson"' not in big


def test_paths_leaving_the_workspace_or_reaching_git_are_refused_with_404(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    for path in ("../../etc/passwd", "prompts/../../manifest.yaml", "/etc/passwd", ".git/config", ".GIT/HEAD",
                 "prompts/./system.md", "prompts//system.md", "-output=x", "no/such/file.md", "a\x00b"):
        for url in (f"/agents/{agent.pk}/files/", f"/agents/{agent.pk}/file/"):
            assert client.get(url, {"ref": "evo-1", "path": path}).status_code == 404, (url, path)
    for ref in ("evo-99", "--output=/tmp/files-pwned", "HEAD~1", "evo-1:manifest.yaml"):
        assert client.get(f"/agents/{agent.pk}/files/", {"ref": ref}).status_code == 404, ref
    assert not Path("/tmp/files-pwned").exists()
    assert client.get(f"/agents/{agent.pk}/file/", {"ref": "evo-1", "path": "prompts"}).status_code == 404
    assert login(personas.outsider).get(f"/agents/{agent.pk}/files/", {"ref": "evo-1"}).status_code == 404


# --- runs named by their number ---------------------------------------------------------------------

def test_run_number_in_url_and_title_agree_and_an_old_id_link_redirects(personas, finished_run):
    other = services.demo_agent_create(personas.owner, personas.alpha)
    first = run_inline(personas.owner, other, cycles=1)
    second = run_inline(personas.owner, other, cycles=1)
    assert (first.number, second.number) == (1, 2) and second.pk >= 3  # the demo agent's run came first
    client = login(personas.owner)
    response = client.get(f"/agents/{other.pk}/runs/2/")
    page = text_of(response)
    assert response.context["run"] == second
    assert "<title>Run 2 · " in page and "<h1>Evolution run 2</h1>" in page
    assert "{#" not in page and "#}" not in page  # no template comment printed
    number = second.cycles.get().number  # cycles count on from the agent's earlier runs
    assert f'href="/agents/{other.pk}/runs/2/cycles/{number}/"' in page
    cycle = text_of(client.get(f"/agents/{other.pk}/runs/2/cycles/{number}/"))
    assert f"<title>Cycle {number} · run 2 · " in cycle
    assert f'<a href="/agents/{other.pk}/runs/2/">run 2</a>' in cycle
    agent_page = text_of(client.get(f"/agents/{other.pk}/"))
    assert f'<a href="/agents/{other.pk}/runs/2/">run 2</a>' in agent_page
    old = client.get(f"/agents/{other.pk}/runs/{second.pk}/cycles/{number}/?failures=1")  # its database id
    assert old.status_code == 302
    assert old["Location"] == f"/agents/{other.pk}/runs/2/cycles/{number}/?failures=1"
    assert client.get(f"/agents/{other.pk}/runs/99999/").status_code == 404
    start = client.post(f"/agents/{other.pk}/runs/start/", {"benchmark": "demo", "engine": "textbook",
                                                            "cycles": "1"})
    third = EvolutionRun.objects.get(agent=other, number=3)
    assert start["Location"] == f"/agents/{other.pk}/runs/3/" == third.get_absolute_url()


# --- engines and benchmarks from what is registered -------------------------------------------------

def test_the_start_form_offers_registered_engines_and_benchmarks_with_labels_spelt_out(personas, demo_agent):
    page = text_of(login(personas.member).get(f"/agents/{demo_agent.pk}/"))
    form = re.search(r'<form method="post" action="/agents/\d+/runs/start/#start-run".*?</form>', page,
                     re.S).group(0)
    engines = re.search(r'<select name="engine".*?</select>', form, re.S).group(0)
    benchmarks = re.search(r'<select name="benchmark".*?</select>', form, re.S).group(0)
    assert re.findall(r'<option value="([^"]+)"', engines) == engine_names()
    assert re.findall(r'<option value="([^"]+)"', benchmarks) == benchmark_names()
    assert '<option value="textbook" selected>' in engines and '<option value="demo" selected>' in benchmarks
    labels = re.findall(r"<label[^>]*>([^<]+)</label>", form)
    assert "Convergence threshold" in labels and "Convergence window (cycles)" in labels
    assert not [label for label in labels if re.search(r"\bEgl\b|_", label)], labels


def test_unregistered_engines_and_benchmarks_are_refused_with_a_clear_error(personas, demo_agent, tmp_path,
                                                                            settings):
    start, client = f"/agents/{demo_agent.pk}/runs/start/", login(personas.member)
    refused = client.post(start, {"benchmark": "demo", "engine": "os.system", "cycles": "1"})
    assert refused.status_code == 400
    said = refused.context["start_form"].errors["engine"]
    offered = ", ".join(engine_names())
    assert said[0].startswith(f"“os.system” is not a registered engine: choose one of {offered}.")
    assert "'os.system' is a dotted path" in said[0] and "CRUCIBLE_ALLOWED_EXTENSIONS" in said[0]
    refused = client.post(start, {"benchmark": "evolve_app.benchmarks:demo_benchmark", "engine": "textbook",
                                  "cycles": "1"})
    assert "is not a registered benchmark" in refused.context["start_form"].errors["benchmark"][0]
    pathless = client.post(start, {"benchmark": "jsonl", "engine": "textbook", "cycles": "1"})
    assert pathless.context["start_form"].errors["benchmark_path"] == [
        "jsonl reads a file on the server: give its absolute path."]
    extra = client.post(start, {"benchmark": "demo", "benchmark_path": "/etc", "engine": "textbook",
                                "cycles": "1"})
    assert extra.context["start_form"].errors["benchmark_path"] == ["demo takes no path: leave this empty."]
    assert not EvolutionRun.objects.exists()
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[tmp_path])
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "t1", "input": "2+2", "expected": "4"}\n')
    outside = client.post(start, {"benchmark": "jsonl", "benchmark_path": "/etc/hostname",
                                  "engine": "textbook", "cycles": "1"})
    assert "must be an absolute path under an allowed directory" in outside.context["start_form"].errors[
        "benchmark"][0]
    started = client.post(start, {"benchmark": "jsonl", "benchmark_path": str(tasks), "engine": "textbook",
                                  "cycles": "1"})
    assert started.status_code == 302 and EvolutionRun.objects.get().benchmark == f"jsonl:{tasks}"
