"""The agent evolution pages with real data: the offline demo agent in a tmp data dir, real
evolution runs (cycles run inline), real git tags, and the personas of tests/conftest.py."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
from django.test import Client

from evolve_app import services
from evolve_app.models import Agent, Cycle, EvolutionRun
from runtime_app.models import Event
from runtime_app.subjects import subject_project_id
from tests.evolve_app.helpers import git
from tests.helpers import login, make_user, text_of

pytestmark = pytest.mark.django_db(transaction=True)




def run_inline(user, agent, cycles: int = 2, **config):
    run = services.evolution_run_start(user, agent, cycles=cycles, config=config, enqueue=False)
    return services.evolution_run_execute(run.pk)


@pytest.fixture
def finished_run(personas, demo_agent):
    """Two cycles of the textbook engine on the demo: each adds a skill, the score goes up."""
    return run_inline(personas.owner, demo_agent, cycles=2)


@pytest.fixture
def waiting_run(personas, demo_agent):
    """Review mode: cycle 1's mutation waits for an approver."""
    run = run_inline(personas.owner, demo_agent, cycles=2, review_mode=True)
    assert run.status == "awaiting_review"
    return run


def browser(response) -> str:
    """The skills and memory browser of an agent page."""
    return re.search(r'<section class="card" id="browser">.*?</section>', text_of(response), re.S).group(0)


def run_url(run) -> str:
    return f"/agents/{run.agent_id}/runs/{run.number}/"


# --- the agents list ----------------------------------------------------------------------------

def test_the_agents_page_lists_each_agent_with_its_project_path_runs_score_and_last_status(
        personas, finished_run):
    agent = finished_run.agent
    response = login(personas.member).get("/agents/")
    page = text_of(response)
    assert response.status_code == 200
    row = re.search(rf'<tr id="agent-{agent.pk}">.*?</tr>', page, re.S).group(0)
    assert agent.name in row and "alpha" in row and agent.path in row and "command" in row
    assert '<td class="num">1</td>' in row  # one run
    assert '<td class="num">0.500</td>' in row  # the demo scores 0.25, then 0.5
    assert "finished" in row and run_url(finished_run) in row
    assert "Import a workspace" in page and "Create the demo agent" in page


def test_an_outsider_does_not_see_other_projects_agents_on_the_list(personas, demo_agent):
    page = text_of(login(personas.outsider).get("/agents/"))
    assert demo_agent.name not in page and demo_agent.path not in page


def test_importing_a_broken_workspace_shows_every_problem_with_its_file_and_line(
        personas, tmp_path, settings):
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[tmp_path])
    folder = tmp_path / "broken"
    (folder / "prompts").mkdir(parents=True)
    (folder / "manifest.yaml").write_text(
        "agent:\n  type: command\nevolvable_layer: [skills]\nreload_strategy: warm\n")
    response = login(personas.member).post("/agents/import/", {
        "project": personas.alpha.pk, "path": str(folder), "name": "broken"})
    page = text_of(response)
    assert response.status_code == 400
    problems = re.findall(r"<li><code>([^<]+)</code></li>", page)
    assert any(p.startswith("manifest.yaml:3") and "evolvable_layers" in p for p in problems), problems
    assert any(p.startswith("manifest.yaml:4") for p in problems)
    assert any(p.startswith("prompts/system.md") for p in problems)
    assert f'value="{folder}"' in page  # what the user typed stays in the form
    assert not Agent.objects.exists()


def test_importing_a_valid_workspace_makes_an_agent_and_opens_its_page(
        personas, make_workspace, tmp_path, settings):
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[tmp_path])
    folder = make_workspace(name="swe")
    response = login(personas.member).post("/agents/import/", {
        "project": personas.alpha.pk, "path": str(folder), "name": "my swe agent"})
    agent = Agent.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/agents/{agent.pk}/"
    assert agent.name == "my swe agent" and agent.project == personas.alpha
    page = text_of(login(personas.member).get(f"/agents/{agent.pk}/"))
    assert "evo-0" in page and "code-search" in page and "read the failing test first" in page


def test_importing_outside_the_allowed_directories_is_refused_on_the_path(personas, tmp_path, settings):
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[tmp_path / "allowed"])
    response = login(personas.owner).post("/agents/import/", {
        "project": personas.alpha.pk, "path": str(tmp_path), "name": ""})
    assert response.status_code == 400
    assert "is not under an allowed directory" in text_of(response)


def test_importing_into_someone_elses_project_is_a_404(personas, tmp_path, settings):
    settings.CONFIG = dataclasses.replace(settings.CONFIG, repo_roots=[tmp_path])
    response = login(personas.outsider).post("/agents/import/", {
        "project": personas.alpha.pk, "path": str(tmp_path), "name": ""})
    assert response.status_code == 404


def test_the_demo_button_creates_a_demo_agent_in_the_chosen_project(personas, tmp_path, settings):
    settings.DATA_DIR = tmp_path
    response = login(personas.member).post("/agents/demo/", {"project": personas.alpha.pk})
    agent = Agent.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/agents/{agent.pk}/"
    assert agent.project == personas.alpha and Path(agent.path).parent == tmp_path / "agents"
    assert login(personas.outsider).post("/agents/demo/", {"project": personas.alpha.pk}).status_code == 404
    assert Agent.objects.count() == 1


def test_a_viewer_gets_no_forms_and_a_403_without_any_files_copied(personas, tmp_path, settings):
    from runtime_app.models import ProjectMembership

    settings.DATA_DIR = tmp_path
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    client = login(viewer)
    page = text_of(client.get("/agents/"))
    assert "Import a workspace" not in page and "Create the demo agent" not in page
    assert client.post("/agents/demo/", {"project": personas.alpha.pk}).status_code == 403
    assert not (tmp_path / "agents").exists()


# --- one agent ------------------------------------------------------------------------------------

def test_the_agent_page_shows_the_manifest_the_version_log_and_the_runs(personas, finished_run):
    agent = finished_run.agent
    response = login(personas.member).get(f"/agents/{agent.pk}/")
    page = text_of(response)
    assert response.status_code == 200
    assert "demo-rules-agent" in page and "evolve_app.agents.CommandAgent" in page
    for tag in ("evo-0", "pre-evo-1", "evo-1", "pre-evo-2", "evo-2"):
        assert f'<code class="ref">{tag}</code>' in page
    sha = git(agent.path, "rev-parse", "evo-2^{commit}")
    assert sha[:10] in page
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", page)  # the tags' dates
    assert f'href="{run_url(finished_run)}"' in page and "2 / 2" in page
    assert "Start an evolution run" in page  # member is an operator
    assert f'action="/agents/{agent.pk}/rollback/#rollback"' not in page  # but not an approver
    assert "Rolling back needs the approver role." in page
    owner_page = text_of(login(personas.owner).get(f"/agents/{agent.pk}/"))
    assert f'action="/agents/{agent.pk}/rollback/#rollback"' in owner_page
    rollback = re.search(r'<form [^>]*id="rollback">.*?</form>', owner_page, re.S).group(0)
    assert '<option value="evo-1">' in rollback and '<option value="pre-evo-1">' not in rollback


def test_the_browser_shows_skills_and_memory_as_they_were_at_a_tag(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    at_start = browser(client.get(f"/agents/{agent.pk}/?ref=evo-0"))
    assert "unit-conversions" in at_start and "date-arithmetic" not in at_start
    later = browser(client.get(f"/agents/{agent.pk}/?ref=evo-2&skill=date-arithmetic"))
    assert "date-arithmetic" in later and "string-transforms" in later
    assert "skills/date-arithmetic/SKILL.md" in later
    skill = git(agent.path, "show", "evo-2:skills/date-arithmetic/SKILL.md")
    assert skill.splitlines()[-1] in later and "name: date-arithmetic" in later
    memory = git(agent.path, "show", "evo-2:memory/episodic.jsonl").splitlines()
    first = json.loads(memory[0])
    assert "memory/episodic.jsonl" in later
    assert all(str(value) in later for value in first.values() if isinstance(value, str))


def test_a_bad_ref_or_skill_in_the_browser_is_harmless(personas, finished_run):
    agent, client = finished_run.agent, login(personas.member)
    for ref in ("--output=/tmp/pwned", "HEAD~1", "evo-99", "refs/heads/../../x", "evo-1\nevo-2", "é" * 300):
        response = client.get(f"/agents/{agent.pk}/", {"ref": ref})
        assert response.status_code == 200
        assert "showing the current files (HEAD)" in browser(response)
        assert "string-transforms" in browser(response)
    assert not Path("/tmp/pwned").exists()
    response = client.get(f"/agents/{agent.pk}/", {"ref": "evo-1", "skill": "../../manifest.yaml"})
    assert response.status_code == 200 and "There is no skill called" in browser(response)


def test_the_agent_page_carries_its_live_activity(personas, finished_run):
    agent = finished_run.agent
    page = text_of(login(personas.member).get(f"/agents/{agent.pk}/"))
    assert f'ws-connect="/ws/events/agent/{agent.pk}/"' in page
    assert "cycle 2 accepted" in page and "evolution.finished" in page
    assert subject_project_id("agent", agent.pk) == personas.alpha.pk
    assert Event.objects.filter(subject_type="agent", subject_id=agent.pk).exists()


def test_starting_a_run_from_the_form_queues_it_with_its_settings(personas, demo_agent):
    response = login(personas.member).post(f"/agents/{demo_agent.pk}/runs/start/", {
        "benchmark": "demo", "engine": "textbook", "cycles": "3", "batch_size": "6",
        "holdout_size": "4", "holdout_tolerance": "0.1", "egl_threshold": "0.02", "egl_window": "2",
        "review_mode": "on"})
    run = EvolutionRun.objects.get()
    assert response.status_code == 302 and response["Location"] == run_url(run)
    assert run.cycles_planned == 3 and run.status == "queued" and run.started_by == personas.member
    assert run.config["batch_size"] == 6 and run.config["holdout_size"] == 4
    assert run.config["review_mode"] is True and run.config["egl_window"] == 2
    page = text_of(login(personas.member).get(run_url(run)))
    assert "queued" in page and 'hx-trigger="every 3s"' in page and "Cancel the run" in page


def test_the_start_form_reports_each_problem_on_its_own_field(personas, demo_agent):
    response = login(personas.member).post(f"/agents/{demo_agent.pk}/runs/start/", {
        "benchmark": "no-such-benchmark", "engine": "no.such.Engine", "cycles": "0", "batch_size": "6",
        "egl_window": "1", "holdout_tolerance": "2"})
    assert response.status_code == 400
    errors = response.context["start_form"].errors
    assert {"benchmark", "engine", "cycles", "egl_window", "holdout_tolerance"} <= set(errors)
    assert "Give 1 to 200 cycles." in errors["cycles"]
    assert "__all__" not in errors  # the settings' problems are on their fields, not repeated
    page = text_of(response)
    assert ("“no-such-benchmark” is not a registered benchmark: choose one of arc, arc-agi-3, arc-agi3, "
            "demo, hle, jsonl, mcp-atlas, skill-bench, swe-verified, task-folder, terminal-bench, "
            "terminal2.") in page
    assert "“no.such.Engine” is not a registered engine: choose one of textbook" in page
    assert not EvolutionRun.objects.exists()


def test_a_start_form_with_a_mistyped_setting_starts_nothing(personas, demo_agent):
    response = login(personas.member).post(f"/agents/{demo_agent.pk}/runs/start/", {
        "benchmark": "demo", "engine": "textbook", "cycles": "2", "batch_size": "many"})
    assert response.status_code == 400 and "batch_size" in response.context["start_form"].errors
    assert not EvolutionRun.objects.exists()


def test_the_start_form_passes_engine_options_as_toml_and_reports_where_they_are_wrong(personas, demo_agent):
    start = f"/agents/{demo_agent.pk}/runs/start/"
    base = {"benchmark": "demo", "engine": "skillforge", "cycles": "1"}
    broken = login(personas.member).post(start, {**base, "engine_options": 'model = "fake\npreset = 1'})
    assert broken.status_code == 400
    assert "line 1, column" in broken.context["start_form"].errors["engine_options"][0]
    nested = login(personas.member).post(start, {**base, "engine_options": "model = [1, 2]"})
    assert nested.status_code == 400 and "model:" in nested.context["start_form"].errors["engine_options"][0]
    unknown = login(personas.member).post(start, {**base, "engine_options": 'modle = "fake-sonnet"'})
    assert unknown.status_code == 400 and "modle" in text_of(unknown)
    assert not EvolutionRun.objects.exists()
    response = login(personas.member).post(start, {
        **base, "engine_options": 'preset = "anthropic"\r\nmodel = "fake-sonnet"\r\neffort = "low"\r\n'})
    run = EvolutionRun.objects.get()
    assert response.status_code == 302 and run.engine == "skillforge"
    assert run.config["engine_options"] == {"preset": "anthropic", "model": "fake-sonnet", "effort": "low"}


def test_a_second_run_while_one_is_active_is_refused_with_the_reason(personas, waiting_run):
    response = login(personas.member).post(f"/agents/{waiting_run.agent_id}/runs/start/", {
        "benchmark": "demo", "engine": "textbook", "cycles": "2"})
    assert response.status_code == 400
    assert "This agent already has a run in progress." in text_of(response)


def test_an_approver_rolls_back_with_a_new_commit_and_a_member_gets_403(personas, finished_run):
    agent = finished_run.agent
    commits = len(git(agent.path, "log", "--oneline").splitlines())
    assert login(personas.member).post(f"/agents/{agent.pk}/rollback/", {
        "tag": "evo-1", "confirm": "on"}).status_code == 403
    unconfirmed = login(personas.owner).post(f"/agents/{agent.pk}/rollback/", {"tag": "evo-1"})
    assert unconfirmed.status_code == 400 and "Tick the box to confirm the rollback." in text_of(unconfirmed)
    bad = login(personas.owner).post(f"/agents/{agent.pk}/rollback/", {"tag": "HEAD", "confirm": "on"})
    assert bad.status_code == 400
    assert len(git(agent.path, "log", "--oneline").splitlines()) == commits
    response = login(personas.owner).post(f"/agents/{agent.pk}/rollback/", {"tag": "evo-1", "confirm": "on"},
                                          follow=True)
    assert response.status_code == 200 and "rolled back to evo-1" in text_of(response)
    assert len(git(agent.path, "log", "--oneline").splitlines()) == commits + 1
    assert git(agent.path, "rev-parse", "HEAD^{tree}") == git(agent.path, "rev-parse", "evo-1^{tree}")
    assert "evo-2" in git(agent.path, "tag").split()  # history kept


# --- runs and cycles ------------------------------------------------------------------------------

def test_the_run_page_shows_status_settings_timeline_and_score_curve(personas, finished_run):
    response = login(personas.member).get(run_url(finished_run))
    page = text_of(response)
    assert response.status_code == 200
    assert "finished" in page and "textbook" in page and "egl_window" in page
    assert 'hx-trigger="every 3s"' not in page and "Cancel the run" not in page  # it has ended
    rows = {number: re.search(rf'<tr id="cycle-{number}".*?</tr>', page, re.S).group(0) for number in (1, 2)}
    assert "0.25" in rows[1] and "+date-arithmetic" in rows[1] and "accepted" in rows[1]
    assert "0.5" in rows[2] and "+string-transforms" in rows[2]
    curve = re.search(r'<figure class="score-plot evo-curve">.*?</figure>', page, re.S).group(0)
    assert "<svg" in curve and curve.count('class="evo-point train"') == 2
    points = re.search(r'class="evo-line train" points="([^"]+)"', curve).group(1).split()
    assert len(points) == 2 and float(points[1].split(",")[1]) < float(points[0].split(",")[1])  # it rose
    assert f'ws-connect="/ws/events/agent/{finished_run.agent_id}/"' in page


def test_the_progress_partial_refreshes_while_a_run_is_active_and_stops_after(personas, waiting_run):
    client = login(personas.member)
    partial = text_of(client.get(run_url(waiting_run) + "progress/"))
    assert 'id="run-progress"' in partial
    assert 'hx-trigger="every 3s"' in partial and "<html" not in partial
    assert "awaiting review" in partial and "an approver decides" in partial  # member: no buttons
    services.evolution_run_cancel(personas.member, waiting_run)
    partial = text_of(client.get(run_url(waiting_run) + "progress/"))
    assert 'hx-trigger="every 3s"' not in partial and "cancelled" in partial


def test_cancel_asks_first_and_only_the_confirmation_cancels(personas, waiting_run):
    client = login(personas.member)
    page = text_of(client.get(run_url(waiting_run)))
    assert f'href="{run_url(waiting_run)}cancel/" id="cancel-run"' in page
    confirm = text_of(client.get(run_url(waiting_run) + "cancel/"))
    assert 'id="confirm-cancel"' in confirm and "1 cycle" in confirm
    waiting_run.refresh_from_db()
    assert waiting_run.status == "awaiting_review"  # looking at the question cancels nothing
    response = client.post(run_url(waiting_run) + "cancel/")
    assert response.status_code == 302 and response["Location"] == run_url(waiting_run)
    waiting_run.refresh_from_db()
    assert waiting_run.status == "cancelled"
    assert "nothing to cancel" in text_of(client.get(run_url(waiting_run) + "cancel/"))


def test_an_approver_approves_a_waiting_cycle_from_the_run_page(personas, waiting_run):
    page = text_of(login(personas.owner).get(run_url(waiting_run)))
    assert 'value="approve"' in page and 'value="reject"' in page
    assert login(personas.member).post(run_url(waiting_run) + "cycles/1/decide/",
                                       {"decision": "approve"}).status_code == 403
    response = login(personas.owner).post(run_url(waiting_run) + "cycles/1/decide/", {"decision": "approve"})
    assert response.status_code == 302 and response["Location"] == run_url(waiting_run) + "#timeline"
    cycle = Cycle.objects.get(run=waiting_run, number=1)
    assert cycle.status == "accepted" and cycle.decided_by == personas.owner
    assert "evo-1" in git(waiting_run.agent.path, "tag").split()
    again = login(personas.owner).post(run_url(waiting_run) + "cycles/1/decide/", {"decision": "approve"},
                                       follow=True)
    assert "not awaiting review" in text_of(again)


def test_an_approver_rejects_a_waiting_cycle_from_its_page_and_the_skill_is_gone(personas, waiting_run):
    path = Path(waiting_run.agent.path)
    assert (path / "skills" / "date-arithmetic" / "SKILL.md").exists()
    response = login(personas.owner).post(run_url(waiting_run) + "cycles/1/decide/",
                                          {"decision": "reject", "back": "cycle"})
    assert response.status_code == 302 and response["Location"] == run_url(waiting_run) + "cycles/1/"
    assert Cycle.objects.get(run=waiting_run, number=1).status == "rejected"
    assert not (path / "skills" / "date-arithmetic").exists()


def test_deciding_on_a_broken_workspace_answers_with_the_problem_not_a_500(personas, waiting_run):
    shutil.rmtree(Path(waiting_run.agent.path) / ".git")  # the workspace's history is gone
    response = login(personas.owner).post(run_url(waiting_run) + "cycles/1/decide/", {"decision": "approve"},
                                          follow=True)
    assert response.status_code == 200
    assert "not a git repository" in text_of(response)
    assert Cycle.objects.get(run=waiting_run, number=1).status == "awaiting_review"


def test_a_waiting_cycle_page_shows_the_pending_mutation_before_anyone_decides(personas, waiting_run):
    page = text_of(login(personas.owner).get(run_url(waiting_run) + "cycles/1/"))
    patch = json.loads(re.search(r'<script id="patch-data" type="application/json">(.*?)</script>',
                                 page, re.S).group(1))
    assert "+++ b/skills/date-arithmetic/SKILL.md" in patch
    assert "awaiting review" in page and 'value="approve"' in page


def test_the_cycle_page_has_the_diff_as_json_data_metadata_and_observations(personas, finished_run):
    response = login(personas.member).get(run_url(finished_run) + "cycles/2/")
    page = text_of(response)
    assert response.status_code == 200
    data = re.search(r'<script id="patch-data" type="application/json">(.*?)</script>', page, re.S)
    patch = json.loads(data.group(1))
    expected = git(finished_run.agent.path, "diff", "--no-color", "pre-evo-2", "evo-2")
    assert "+++ b/skills/string-transforms/SKILL.md" in patch
    assert patch.strip().splitlines()[-1] == expected.splitlines()[-1]
    assert "vendor/diff2html/diff2html-ui-base.min.js" in page and 'data-patch-source="patch-data"' in page
    assert "0.5" in page and "string-transforms" in page
    rows = re.findall(r'<tr class="obs-(success|failure)">', page)
    assert len(rows) == 12 and rows.count("success") == 6  # score 0.5 on a batch of 12


def test_the_failures_filter_shows_only_failed_observations(personas, finished_run):
    client = login(personas.member)
    cycle = Cycle.objects.get(run=finished_run, number=1)
    failed = cycle.observations.filter(success=False)
    page = text_of(client.get(run_url(finished_run) + "cycles/1/", {"failures": "1"}))
    rows = re.findall(r'<tr class="obs-(success|failure)">', page)
    assert rows == ["failure"] * failed.count() and failed.count() == 9
    assert all(o.task_id in page for o in failed)
    assert not any(o.task_id in page for o in cycle.observations.filter(success=True))
    assert "Failures only" in page and "Show all" in page


def test_a_long_agent_output_is_truncated_with_the_full_text_in_details(personas, finished_run):
    cycle = Cycle.objects.get(run=finished_run, number=1)
    observation = cycle.observations.first()
    observation.agent_output = "start " + "x" * 500 + " the-very-end"
    observation.save()
    page = text_of(login(personas.member).get(run_url(finished_run) + "cycles/1/"))
    assert "<details><summary><code>start xxx" in page and "the-very-end</pre></details>" in page


def test_cancelling_an_active_run_needs_an_operator_and_says_what_happened(personas, waiting_run):
    response = login(personas.member).post(run_url(waiting_run) + "cancel/", follow=True)
    assert "cancelled" in text_of(response)
    waiting_run.refresh_from_db()
    assert waiting_run.status == "cancelled"
    again = login(personas.member).post(run_url(waiting_run) + "cancel/", follow=True)
    assert "nothing to cancel" in text_of(again)


# --- access -----------------------------------------------------------------------------------------

def test_an_outsider_gets_404_on_every_page_and_post(personas, waiting_run):
    client = login(personas.outsider)
    agent_url = f"/agents/{waiting_run.agent_id}/"
    for url in (agent_url, agent_url + "?ref=evo-0", run_url(waiting_run), run_url(waiting_run) + "progress/",
                run_url(waiting_run) + "cycles/1/"):
        assert client.get(url).status_code == 404, url
    for url, data in ((agent_url + "runs/start/", {"benchmark": "demo", "engine": "textbook", "cycles": "1"}),
                      (agent_url + "rollback/", {"tag": "evo-0", "confirm": "on"}),
                      (run_url(waiting_run) + "cancel/", {}),
                      (run_url(waiting_run) + "cycles/1/decide/", {"decision": "approve"})):
        assert client.post(url, data).status_code == 404, url
    assert Cycle.objects.get(run=waiting_run, number=1).status == "awaiting_review"
    waiting_run.refresh_from_db()
    assert waiting_run.status == "awaiting_review"


def test_a_run_or_cycle_of_another_agent_is_a_404(personas, finished_run, tmp_path):
    other = services.demo_agent_create(personas.owner, personas.alpha)
    client = login(personas.owner)
    assert client.get(f"/agents/{other.pk}/runs/{finished_run.pk}/").status_code == 404
    assert client.get(f"/agents/{other.pk}/runs/{finished_run.pk}/cycles/1/").status_code == 404
    assert client.get(run_url(finished_run) + "cycles/9/").status_code == 404


def test_runs_are_called_by_their_agents_own_count_never_the_database_id(personas, finished_run):
    other = services.demo_agent_create(personas.owner, personas.alpha)
    first = run_inline(personas.owner, other, cycles=1)
    second = run_inline(personas.owner, other, cycles=1)
    assert (first.number, second.number) == (1, 2) and second.pk >= 3  # the other agent ran first
    said = f"run {second.pk}"
    client = login(personas.owner)
    page = text_of(client.get(run_url(second)))
    assert "Evolution run 2" in page and said not in page
    cycle = text_of(client.get(run_url(second) + f"cycles/{second.cycles.get().number}/"))
    assert "run 2" in cycle and said not in cycle
    agent_page = text_of(client.get(f"/agents/{other.pk}/"))
    assert "run 2" in agent_page and "run 1" in agent_page and said not in agent_page
    assert [client.get(f"/api/runs/{run.pk}").json()["number"] for run in (first, second)] == [1, 2]
    messages = list(Event.objects.filter(subject_type="agent", subject_id=other.pk).values_list(
        "payload__message", flat=True))
    assert any("run 2 queued" in str(text) for text in messages)
    assert not any(said in str(text) for text in messages)


def test_every_post_needs_a_csrf_token(personas, waiting_run, tmp_path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.owner)
    agent_url = f"/agents/{waiting_run.agent_id}/"
    for url, data in (("/agents/import/", {"project": personas.alpha.pk, "path": str(tmp_path)}),
                      ("/agents/demo/", {"project": personas.alpha.pk}),
                      (agent_url + "runs/start/", {"benchmark": "demo", "engine": "textbook", "cycles": "1"}),
                      (agent_url + "rollback/", {"tag": "evo-0", "confirm": "on"}),
                      (run_url(waiting_run) + "cancel/", {}),
                      (run_url(waiting_run) + "cycles/1/decide/", {"decision": "approve"})):
        assert client.post(url, data).status_code == 403, url
    assert Agent.objects.count() == 1 and EvolutionRun.objects.count() == 1
    assert Cycle.objects.get(run=waiting_run, number=1).status == "awaiting_review"


def test_the_pages_only_answer_the_methods_they_are_for(personas, finished_run):
    client = login(personas.owner)
    assert client.get("/agents/import/").status_code == 405
    assert client.get(f"/agents/{finished_run.agent_id}/rollback/").status_code == 405
    assert client.post(f"/agents/{finished_run.agent_id}/").status_code == 405
