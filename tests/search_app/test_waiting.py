""""Waiting for you" (runtime_app/waiting.py with search_app/waiting.py and evolve_app/waiting.py):
exactly what each signed-in person can act on, per project, and nothing from projects they cannot see."""

from __future__ import annotations

import html
import re
from datetime import timedelta

from django.utils import timezone

from evolve_app.models import Agent, Cycle, EvolutionRun
from runtime_app import access
from runtime_app.models import Event, ProjectMembership
from runtime_app.waiting import waiting_changed_by, waiting_for, waiting_fragment
from search_app import services
from search_app.models import Candidate, SearchRun
from tests.helpers import login, make_user
from tests.search_app.helpers import patch_write
from tests.search_app.runs import plan_repo, spec_text


def winner_in(project, author, tmp_path, name: str):
    """A search of `project` frozen by `author` whose cand_002 won and awaits approval (nothing ran)."""
    repo = plan_repo(tmp_path / name, {"cand_001": 4, "cand_002": 9, "note": name})
    search = services.search_freeze(author, project, spec_text(population=2, rounds=[2, 1]), "HEAD",
                                    repository_path=str(repo))
    services.search_start(author, search, enqueue=False)
    winner = search.candidates.get(candidate_id="cand_002")
    patch_write(repo, winner, "def answer():\n    return 9\n")
    Candidate.objects.filter(pk=winner.pk).update(state=Candidate.State.WINNER)
    SearchRun.objects.filter(search=search).update(
        status=SearchRun.Status.FINISHED, phase=SearchRun.Phase.DONE, outcome=SearchRun.WINNER, winner=winner,
        finished_at=timezone.now())
    winner.refresh_from_db()
    return search, winner


def kinds(user) -> list[tuple[str, str, str]]:
    return [(item.kind, item.project, item.title) for item in waiting_for(user)]


def test_each_person_sees_exactly_what_they_can_act_on_and_nothing_of_other_projects(personas, approver,
                                                                                      tmp_path, data_dir):
    # alpha: owner (admin, its author), member (operator), approver; beta: outsider (admin), bea (approver)
    bea = make_user("bea")
    ProjectMembership.objects.create(project=personas.beta, user=bea, role=access.APPROVER)
    search, winner = winner_in(personas.alpha, personas.owner, tmp_path, "alpha-repo")
    beta_search, _ = winner_in(personas.beta, personas.outsider, tmp_path, "beta-repo")

    approve = ("approve", "alpha", f"Approve cand_002 of {search.name}")
    assert kinds(approver) == [approve]
    assert kinds(personas.owner) == []  # its author may not approve it (CRUCIBLE_SELF_APPROVAL is off)
    assert kinds(personas.member) == []  # an operator may not approve
    assert kinds(bea) == [("approve", "beta", f"Approve cand_002 of {beta_search.name}")]
    assert kinds(personas.outsider) == []

    # A request for changes: its author is asked to act; the approver has decided on this patch.
    services.approval_record(approver, winner, "request_changes", winner.patch_sha256, note="rename it")
    assert kinds(approver) == []
    assert kinds(personas.owner) == [
        ("changes requested", "alpha", f"Changes requested on cand_002 of {search.name}")]

    # The approver changes their mind and approves: the winner is approved; approvers may merge it.
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    merge = ("merge", "alpha", f"Merge cand_002 of {search.name}")
    assert kinds(approver) == [merge] and kinds(personas.owner) == [merge]
    assert kinds(personas.member) == [] and merge not in kinds(bea) + kinds(personas.outsider)
    services.merge_create(approver, search)
    assert kinds(approver) == [] and kinds(personas.owner) == []


def test_a_thread_waits_for_whoever_it_mentions_or_involves_until_they_answer(personas, approver, tmp_path,
                                                                              data_dir):
    search, winner = winner_in(personas.alpha, personas.owner, tmp_path, "repo")
    services.approval_record(approver, winner, "approve", winner.patch_sha256)  # nothing else waits for them
    thread = services.comment_add(personas.member, winner, "@approver why 9? cc @approv")
    title = f"Thread #{thread.pk} on cand_002 of {search.name}"
    assert ("reply", "alpha", title) in kinds(approver)
    assert ("reply", "alpha", title) not in kinds(personas.member)  # the last word is theirs
    assert ("reply", "alpha", title) not in kinds(personas.owner)  # neither mentioned nor involved

    services.comment_add(approver, winner, "It is the answer.", reply_to=thread.pk)
    assert ("reply", "alpha", title) not in kinds(approver)
    assert ("reply", "alpha", title) in kinds(personas.member)  # a reply they have not answered
    services.thread_resolve(personas.member, winner, thread.pk)
    assert ("reply", "alpha", title) not in kinds(personas.member)

    # A name that only begins like theirs is no mention: @approverx, @approv.
    other = services.comment_add(personas.owner, winner, "@approverx, @approv: see line 1")
    assert f"Thread #{other.pk}" not in " ".join(item.title for item in waiting_for(approver))
    # An outsider is never told about a thread of a project they cannot see, even when named in it.
    services.comment_add(personas.member, winner, f"@{personas.outsider.get_username()} have a look")
    assert kinds(personas.outsider) == []


def test_their_own_searches_that_failed_or_came_out_none_recently_wait_for_them(personas, tmp_path, data_dir):
    failed, _ = winner_in(personas.alpha, personas.owner, tmp_path, "failed-repo")
    none, _ = winner_in(personas.alpha, personas.owner, tmp_path, "none-repo")
    old, _ = winner_in(personas.alpha, personas.owner, tmp_path, "old-repo")
    SearchRun.objects.filter(search=failed).update(outcome=SearchRun.NONE, winner=None,
                                                   reason="stopped: the gate command cannot start")
    SearchRun.objects.filter(search=none).update(outcome=SearchRun.NONE, winner=None,
                                                 reason="no candidate survived round 0")
    SearchRun.objects.filter(search=old).update(outcome=SearchRun.NONE, winner=None, reason="no candidate",
                                                finished_at=timezone.now() - timedelta(days=30))
    items = [item for item in waiting_for(personas.owner) if item.kind == "failed"]
    assert sorted(item.status for item in items) == ["NONE (no candidate survived round 0)",
                                                     "failed (stopped: the gate command cannot start)"]
    assert [item for item in waiting_for(personas.member) if item.kind == "failed"] == []


def test_an_evolution_run_awaiting_review_waits_for_the_approvers_of_its_project(personas, approver,
                                                                                tmp_path):
    agent = Agent.objects.create(project=personas.alpha, name="helper", path=str(tmp_path / "agent"))
    run = EvolutionRun.objects.create(agent=agent, number=1, benchmark="demo", engine="textbook",
                                      cycles_planned=3, status=EvolutionRun.Status.AWAITING_REVIEW)
    Cycle.objects.create(run=run, number=1, status=Cycle.Status.AWAITING_REVIEW, summary="adds a skill")
    [item] = waiting_for(approver)
    assert (item.kind, item.title, item.url) == ("review", "Review cycle 1 of helper run 1",
                                                 f"/agents/{agent.pk}/runs/{run.pk}/cycles/1/")
    assert item.status == "awaiting approval (cycle 1 holds a change for review)"
    assert waiting_for(personas.member) == [] and waiting_for(personas.outsider) == []


def test_the_api_lists_the_same_items_per_project(personas, approver, tmp_path, data_dir):
    search, _ = winner_in(personas.alpha, personas.owner, tmp_path, "repo")
    answer = login(approver).get("/api/waiting").json()
    assert answer["count"] == 1
    [project] = answer["projects"]
    assert (project["project"], project["items"][0]["kind"]) == ("alpha", "approve")
    assert project["items"][0]["url"] == f"/searches/{search.search_id}/candidates/cand_002/decide/"
    assert project["items"][0]["status"] == "awaiting approval (0 of 1 approval)"
    assert login(personas.outsider).get("/api/waiting").json() == {"count": 0, "projects": []}
    assert login(personas.member).get("/api/waiting").json()["count"] == 0


def test_the_home_page_shows_what_waits_and_the_socket_sends_it_again_after_a_decision(personas, approver,
                                                                                      tmp_path, data_dir):
    search, winner = winner_in(personas.alpha, personas.owner, tmp_path, "repo")
    page = html.unescape(login(approver).get("/").content.decode())
    card = page[page.index('id="waiting-for-you"'):]
    assert f"Approve cand_002 of {search.name}" in card[:card.index("</section>")]
    assert "Nothing waits for you" in login(personas.member).get("/").content.decode()

    last = Event.objects.order_by("-pk").first().pk
    services.approval_record(approver, winner, "approve", winner.patch_sha256)
    events = list(Event.objects.filter(pk__gt=last))
    assert waiting_changed_by(events)
    fragment = waiting_fragment(approver)
    assert 'id="waiting-for-you" aria-labelledby="waiting-heading" hx-swap-oob="true"' in fragment
    assert "Approve cand_002" not in fragment and "Merge cand_002" in fragment
    assert not waiting_changed_by([Event(kind="candidate.updated")])


def test_the_home_page_names_the_demo_search_and_shows_no_raw_backticks(personas):
    personas.alpha.description = "Made by `make run` to try Crucible."
    personas.alpha.save()
    page = login(personas.owner).get("/").content.decode()
    assert "demo: scripted writers speed up the certificate" in page
    assert "manage.py search run search_app/spec_templates/demo-scripted.toml" in page
    text = re.sub(r"<[^>]+>", "", page[page.index("<main"):] if "<main" in page else page)
    assert "`" not in text and "<code>make run</code>" in page
