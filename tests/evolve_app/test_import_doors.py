"""The import preview and warnings through every door: the pages (preview, confirm, edit), the
API (`POST /api/agents/preview`, `manifest` on import, `warnings`), the CLI (`evolve import`
prints the preview; `--accept-inferred`, `--manifest FILE`); and the agent page's truncated
file views with their download."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from django.test import Client

from evolve_app import services
from evolve_app.models import Agent
from evolve_app.workspace import PAGE_FILE_CHARS, workspace_snapshot
from tests.evolve_app.helpers import SEED_MANIFEST, git
from tests.evolve_app.import_shapes import SKILL, shape_make, tree_snapshot
from tests.evolve_app.test_api import bearer, post
from tests.evolve_app.test_cli import data_dir, evolve  # noqa: F401  (a fixture)
from tests.helpers import login, text_of
from tests.search_app.fixtures import demo  # noqa: F401  (the admin user and the demo project)

pytestmark = pytest.mark.django_db(transaction=True)

ARC_MAS = ('name: arc-mas\nversion: 0.1.0\ncontract_version: "1.0"\ndescription: Multi-agent ARC solver\n'
           + SEED_MANIFEST)



def seed_folder(parent, name: str, manifest: str = SEED_MANIFEST):
    root = parent / name
    for rel, text in {"manifest.yaml": manifest, "prompts/system.md": "Be careful.\n",
                      "skills/code-search/SKILL.md": SKILL.format(name="code-search")}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# ------------------------------------------------------------------------------------- the API


def test_the_api_previews_a_folder_without_a_manifest_and_imports_it_with_that_manifest(personas, roots):
    member = bearer(personas.member)
    root = shape_make(roots, "tb2_clawcode_opus46")
    before = tree_snapshot(root)
    refused = post(member, "/api/agents/import", {"project": personas.alpha.pk, "path": str(root)})
    assert refused.status_code == 400
    assert "has no manifest.yaml: preview the manifest" in refused.json()["detail"]
    preview = post(member, "/api/agents/preview", {"project": "alpha", "path": str(root)})
    assert preview.status_code == 200, preview.json()
    body = preview.json()
    assert (body["has_manifest"], body["prompt_from"], body["writes"], body["problems"]) == (
        False, "prompt.md", ["manifest.yaml", "prompts/system.md"], [])
    assert yaml.safe_load(body["manifest"])["agent"]["type"] == "reference"
    assert [entry.split(": ", 1)[0] for entry in body["unused"]] == ["prompt.md"]
    assert "the system prompt the import copied to prompts/system.md" in body["unused"][0]
    assert tree_snapshot(root) == before

    edited = body["manifest"].replace("reload_strategy: hot", "reload_strategy: warm")
    bad = post(member, "/api/agents/import", {"project": "alpha", "path": str(root), "manifest": edited})
    assert bad.status_code == 400
    assert [p.split(": ", 1)[0] for p in bad.json()["errors"]["path"]] == ["manifest.yaml:11:18"]
    assert tree_snapshot(root) == before and not Agent.objects.exists()

    created = post(member, "/api/agents/import", {"project": "alpha", "path": str(root),
                                                  "manifest": body["manifest"]})
    assert created.status_code == 201, created.json()
    assert (created.json()["name"], created.json()["agent_type"], created.json()["warnings"]) == (
        "tb2_clawcode_opus46", "reference", [])
    copy = Path(created.json()["path"])
    assert created.json()["source_path"] == str(root) and copy != root
    assert (copy / "prompts/system.md").read_text() == (root / "prompt.md").read_text()
    assert (copy / "manifest.yaml").read_text() == body["manifest"]
    assert git(copy, "tag") == "evo-0"
    assert tree_snapshot(root) == before  # the folder is never written
    assert any(w.startswith("manifest.yaml: the folder has no manifest.yaml")
               and "as Crucible inferred it" in w for w in created.json()["import_warnings"])
    assert any(w.startswith("prompt.md: not used: the system prompt the import copied to prompts/system.md")
               for w in created.json()["import_warnings"])


def test_the_api_imports_with_the_inferred_manifest_when_asked_and_shows_it_as_warnings(personas, roots):
    member = bearer(personas.member)
    root = shape_make(roots, "mcp_mh_opus46")
    before = tree_snapshot(root)
    created = post(member, "/api/agents", {"project": "alpha", "path": str(root), "infer": True})
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["source_path"] == str(root) and tree_snapshot(root) == before
    assert yaml.safe_load((Path(body["path"]) / "manifest.yaml").read_text())["evolvable_layers"] == [
        "prompts", "skills", "memory", "tools"]
    warnings = body["import_warnings"]
    assert "manifest.yaml: the folder has no manifest.yaml: its copy has one, as Crucible inferred it" in \
        warnings[0]
    assert any(w.startswith("harness.py: not used: an A-Evolve agent's own harness") for w in warnings)
    assert any(w.startswith("REPORT.md: not used: a report or results") for w in warnings)
    assert any(w.startswith("results.json: not used: a report or results") for w in warnings)
    shown = post(member, "/api/agents/import", {"project": "alpha", "path": str(root), "infer": True})
    assert shown.status_code == 201 and shown.json()["id"] == body["id"]  # the same agent, with a note
    assert "is already imported into alpha" in shown.json()["note"] and Agent.objects.count() == 1
    detail = bearer(personas.member).get(f"/api/agents/{body['id']}")
    assert detail.json()["import_warnings"] == warnings


def test_the_api_imports_a_manifest_with_unknown_keys_and_returns_them_as_warnings(personas, roots):
    root = seed_folder(roots, "arc-mas", ARC_MAS)
    created = post(bearer(personas.member), "/api/agents/import", {"project": "alpha", "path": str(root)})
    assert created.status_code == 201, created.json()
    assert created.json()["warnings"] == [
        "manifest.yaml:4:1: unknown key 'description' in the manifest, kept but not used by Crucible (known "
        "keys: name, version, contract_version, agent, evolvable_layers, reload_strategy)"]
    assert created.json()["name"] == "arc-mas"


def test_the_api_preview_keeps_the_import_rules(personas, roots, tmp_path):
    root = shape_make(roots, "osworld")
    outside = shape_make(tmp_path, "mcp_mh_opus46")
    member = bearer(personas.member)
    refused = post(member, "/api/agents/preview", {"project": "alpha", "path": str(outside)})
    assert refused.status_code == 400 and "not under an allowed directory" in refused.json()["detail"]
    assert post(bearer(personas.outsider), "/api/agents/preview",
                {"project": "alpha", "path": str(root)}).status_code == 404
    manifest = post(member, "/api/agents/preview", {"project": "alpha", "path": str(root)}).json()["manifest"]
    own = seed_folder(roots, "own")
    clash = post(member, "/api/agents/import", {"project": "alpha", "path": str(own), "manifest": manifest})
    assert clash.status_code == 400 and "has its own manifest.yaml" in clash.json()["detail"]


def test_an_oversized_skill_is_refused_naming_the_limit(personas, roots):
    root = seed_folder(roots, "big")
    with open(root / "skills/code-search/SKILL.md", "r+b") as handle:
        handle.truncate(100 * 2**20)
    refused = post(bearer(personas.member), "/api/agents/import", {"project": "alpha", "path": str(root)})
    assert refused.status_code == 400
    assert any(p.startswith("skills/code-search/SKILL.md: 100.0 MiB, over the limit of 4.0 MiB per file "
                            "(MAX_FILE_BYTES)") for p in refused.json()["errors"]["path"])
    assert not (root / ".git").exists() and not Agent.objects.exists()


# ------------------------------------------------------------------------------------- the pages


def test_the_import_form_leads_a_folder_without_a_manifest_to_its_preview_then_imports_it(personas, roots):
    client = login(personas.member)
    root = shape_make(roots, "mcp_mh_opus46")
    before = tree_snapshot(root)
    response = client.post("/agents/import/", {"project": personas.alpha.pk, "path": str(root), "name": ""})
    assert response.status_code == 302
    target = urlparse(response["Location"])
    assert target.path == "/agents/import/preview/"
    assert parse_qs(target.query)["path"] == [str(root)]
    page = client.get(response["Location"])
    assert page.status_code == 200
    text = text_of(page)
    manifest = re.search(r'<textarea name="manifest"[^>]*>\n?(.*?)</textarea>', text, re.S).group(1)
    assert yaml.safe_load(manifest)["evolvable_layers"] == ["prompts", "skills", "memory", "tools"]
    assert "Other files (REPORT.md, harness.py, results.json)" in text
    assert tree_snapshot(root) == before

    form = {"project": personas.alpha.pk, "path": str(root), "name": "mcp"}
    broken = client.post("/agents/import/preview/", {**form, "manifest": manifest.replace(
        "type: reference", "type: [reference")})
    assert broken.status_code == 400
    assert re.search(r"<code>manifest\.yaml:5:\d+: YAML syntax error: in the '\[' … '\]' list that "
                     "starts here", text_of(broken))
    assert tree_snapshot(root) == before and not Agent.objects.exists()

    assert "harness.py</code> not used: an A-Evolve agent's own harness" in text  # listed before import

    done = client.post("/agents/import/preview/", {**form, "manifest": manifest.replace("\n", "\r\n")})
    agent = Agent.objects.get()
    assert done.status_code == 302 and done["Location"] == f"/agents/{agent.pk}/"
    assert agent.name == "mcp" and agent.agent_type == "reference"
    assert (Path(agent.path) / "manifest.yaml").read_text() == manifest  # the browser's CRLF undone
    assert git(agent.path, "tag") == "evo-0"
    assert tree_snapshot(root) == before and agent.source_path == str(root)
    page = text_of(client.get(f"/agents/{agent.pk}/"))
    assert 'id="import-warnings"' in page and "as Crucible inferred it from the folder's files" in page
    assert "harness.py</code> not used: an A-Evolve agent's own harness" in page
    assert f"Crucible's copy of <code class=\"path\">{root}</code>" in page


def test_the_preview_page_is_for_operators_of_the_project_and_folders_under_the_roots(personas, roots):
    root = shape_make(roots, "osworld")
    query = f"?project={personas.alpha.pk}&path={root}"
    assert login(personas.outsider).get("/agents/import/preview/" + query).status_code == 404
    seed_folder(roots, "own")
    has_one = login(personas.member).get(f"/agents/import/preview/?project={personas.alpha.pk}"
                                         f"&path={roots / 'own'}")
    assert has_one.status_code == 302 and has_one["Location"] == "/agents/#agent-import"


def test_an_import_with_unknown_keys_shows_them_as_warnings_after_the_import_and_on_the_agent_page(
        personas, roots):
    root = seed_folder(roots, "arc-mas", ARC_MAS)
    client = login(personas.member)
    response = client.post("/agents/import/", {"project": personas.alpha.pk, "path": str(root), "name": ""},
                           follow=True)
    text = text_of(response)
    assert response.status_code == 200
    assert f"Agent arc-mas imported into alpha: a copy of {root}, which is never written." in text
    assert '<li class="warning">warning: manifest.yaml:4:1: unknown key \'description\'' in text
    again = text_of(client.get(f"/agents/{Agent.objects.get().pk}/"))
    assert "Kept in manifest.yaml but not used by Crucible" in re.sub(r"</?code>", "", again)
    assert "warning: manifest.yaml:4:1: unknown key 'description'" in again
    twice = text_of(client.post("/agents/import/", {"project": personas.alpha.pk, "path": str(root),
                                                    "name": ""}, follow=True))
    assert f"{root} is already imported into alpha as agent arc-mas" in twice
    assert Agent.objects.count() == 1


# ------------------------------------------------------------------------------ big files in pages


@pytest.fixture
def big_agent(personas, roots):
    big = "x" * 50 + "\n"
    root = seed_folder(roots, "big")
    (root / "skills/huge").mkdir()
    (root / "skills/huge/SKILL.md").write_text(SKILL.format(name="huge") + big * 6000)  # 306 KB
    (root / "memory").mkdir()
    (root / "memory/episodic.jsonl").write_text(('{"lesson": "' + "y" * 990 + '"}\n') * 300)  # 300 KB
    return services.agent_import(personas.member, personas.alpha, str(root))


def test_the_agent_page_truncates_a_big_file_and_offers_its_download(personas, big_agent):
    client = login(personas.member)
    page = text_of(client.get(f"/agents/{big_agent.pk}/?skill=huge"))
    skill = re.search(r'<pre class="block skill-text">(.*?)</pre>', page, re.S).group(1)
    assert len(skill) == PAGE_FILE_CHARS
    assert f"Showing the first {PAGE_FILE_CHARS} characters of" in page
    link = f"/agents/{big_agent.pk}/file/?ref=HEAD&path=skills/huge/SKILL.md"
    assert f'href="{link}"' in page
    assert "memory/episodic.jsonl" in page and page.count("Download the whole file") == 2
    download = client.get(link)
    assert download.status_code == 200
    assert download["Content-Disposition"] == 'attachment; filename="SKILL.md"'
    assert download.content == (Path(big_agent.path) / "skills/huge/SKILL.md").read_bytes()


def test_the_download_is_for_members_only_and_never_leaves_the_workspace(personas, big_agent):
    url = f"/agents/{big_agent.pk}/file/?ref=HEAD&path="
    assert Client().get(url + "prompts/system.md").status_code == 302  # to the login page
    assert login(personas.outsider).get(url + "prompts/system.md").status_code == 404
    member = login(personas.member)
    assert member.get(url + "prompts/system.md").content == b"Be careful.\n"
    for path in ("../../etc/passwd", "/etc/passwd", ".git/config", "prompts/../manifest.yaml", "skills",
                 "prompts//system.md", "nope.md"):
        assert member.get(url + path).status_code == 404, path
    assert member.get(f"/agents/{big_agent.pk}/file/?ref=main~1&path=prompts/system.md").status_code == 404
    (Path(big_agent.path) / "skills/leak").mkdir()
    (Path(big_agent.path) / "skills/leak/SKILL.md").symlink_to("/etc/hostname")
    workspace_snapshot(big_agent.path, "evo-1", "a symlink committed")
    assert git(big_agent.path, "ls-tree", "HEAD", "skills/leak/SKILL.md").startswith("120000")
    assert member.get(url + "skills/leak/SKILL.md").status_code == 404
    assert member.get(f"/agents/{big_agent.pk}/file/?ref=evo-0&path=skills/huge/SKILL.md").status_code == 200


# ------------------------------------------------------------------------------------- the CLI


def test_the_cli_prints_the_preview_and_imports_only_when_told(demo, data_dir, tmp_path):  # noqa: F811
    root = shape_make(tmp_path, "tb2_clawcode_opus46")
    before = tree_snapshot(root)
    shown = evolve("import", str(root))
    assert shown.returncode == 1
    assert yaml.safe_load(shown.stdout)["name"] == "tb2_clawcode_opus46"  # `> draft.yaml` saves it
    lines = shown.stderr.strip().splitlines()
    assert lines[0] == f"{root} has no manifest.yaml; above is the one Crucible infers from its files."
    assert any(line.startswith("note: The system prompt is prompt.md") for line in lines)
    assert "--accept-inferred" in lines[-1] and "--manifest FILE" in lines[-1]
    as_json = evolve("import", str(root), "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["manifest"] == shown.stdout
    assert json.loads(as_json.stdout)["writes"] == ["manifest.yaml", "prompts/system.md"]
    assert tree_snapshot(root) == before and not Agent.objects.exists()

    draft = tmp_path / "draft.yaml"
    draft.write_text(shown.stdout.replace("reload_strategy: hot", "reload_strategy: warm"))
    bad = evolve("import", str(root), "--manifest", str(draft))
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "manifest.yaml:11:18: reload_strategy: 'warm' is not allowed; use one of hot, cold",
        f"{root}: 1 problem, nothing imported"]
    assert tree_snapshot(root) == before

    draft.write_text(shown.stdout.replace("name: tb2_clawcode_opus46", "name: claw"))
    done = evolve("import", str(root), "--manifest", str(draft))
    assert done.returncode == 0, done.stderr
    agent = Agent.objects.get()
    assert agent.name == "claw" and (Path(agent.path) / "manifest.yaml").read_text() == draft.read_text()
    assert tree_snapshot(root) == before
    assert "warning: manifest.yaml: the folder has no manifest.yaml: its copy has one, as edited in its " \
           "import preview" in done.stderr


def test_the_cli_accepts_the_inferred_manifest_and_prints_warnings(demo, data_dir, tmp_path):  # noqa: F811
    root = shape_make(tmp_path, "osworld")
    before = tree_snapshot(root)
    done = evolve("import", str(root), "--accept-inferred", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert "imported without a system prompt" in (Path(body["path"]) / "prompts/system.md").read_text()
    assert tree_snapshot(root) == before and body["source_path"] == str(root)
    assert body["import_warnings"][0].startswith("manifest.yaml: the folder has no manifest.yaml")
    assert any(line.startswith("warning: manifest.yaml: No system prompt")
               for line in done.stderr.splitlines())
    arc = seed_folder(tmp_path, "arc-mas", ARC_MAS)
    warned = evolve("import", str(arc))
    assert warned.returncode == 0, warned.stderr
    assert warned.stderr.splitlines()[-1] == (
        "warning: manifest.yaml:4:1: unknown key 'description' in the manifest, kept but not used by "
        "Crucible (known keys: name, version, contract_version, agent, evolvable_layers, reload_strategy)")
    assert Agent.objects.count() == 2
    again = evolve("import", str(arc))
    assert again.returncode == 0 and Agent.objects.count() == 2
    assert again.stderr.startswith(f"note: {arc} is already imported into demo as agent arc-mas")
