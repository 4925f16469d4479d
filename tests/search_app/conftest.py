"""Fixtures shared by the search tests: the demo project and a small planned search."""

from __future__ import annotations

import hashlib

import pytest

from runtime_app import access
from runtime_app.models import Project, ProjectMembership
from tests.conftest import make_user
from tests.gitrepo import git
from tests.search_app.runs import fates, frozen, run_inline


@pytest.fixture
def data_dir(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


@pytest.fixture
def demo(transactional_db):
    """The `demo` project the CLI uses by default, with `admin` as its operator."""
    admin = make_user("admin")
    project = Project.objects.create(name="demo", created_by=admin)
    ProjectMembership.objects.create(project=project, user=admin, role=access.OPERATOR)
    return project


@pytest.fixture
def small_search(personas, tmp_path, data_dir):
    """A frozen two-candidate search of project alpha: cand_001 scores 4, cand_002 edits the tests."""
    return frozen(personas, tmp_path, {"cand_001": 4, "cand_002": "tests"}, repo_name="repo",
                  population=2, rounds=[2, 1])


@pytest.fixture
def finished(personas, tmp_path, data_dir):
    """A finished search of project alpha whose winner, cand_002, returns 9."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9}, repo_name="repo",
                    population=2, rounds=[2, 1])
    run = run_inline(personas, search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002", fates(search)
    return search, run.winner, tmp_path / "repo"


def patch_write(repo, candidate, text: str) -> None:
    """Give `candidate` the patch that makes code/answer.py read `text`, the way a refinement
    rewrites it (services.steps._refinement_apply): new bytes, hash, round, line count and files."""
    answer = repo / "code" / "answer.py"
    baseline = answer.read_text()
    answer.write_text(text)
    try:
        patch = (git(repo, "diff", "--no-color", "--", "code/answer.py") + "\n").encode()
    finally:
        answer.write_text(baseline)
    if candidate.patch_sha256:  # a refinement: the next round's writer wrote it
        candidate.patch_round += 1
    candidate.patch, candidate.patch_sha256 = patch, hashlib.sha256(patch).hexdigest()
    candidate.diff_lines, candidate.files = patch.count(b"\n"), ["code/answer.py"]
    candidate.save()


@pytest.fixture
def reviewing(personas, tmp_path, data_dir):
    """A started search of project alpha (nothing run: quick) whose cand_002 has a real patch
    making answer() return 9; its page, comments and threads work as for a winner."""
    from search_app import services

    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9}, repo_name="repo",
                    population=2, rounds=[2, 1])
    services.search_start(personas.owner, search, enqueue=False)
    candidate = search.candidates.get(candidate_id="cand_002")
    patch_write(tmp_path / "repo", candidate, "def answer():\n    return 9\n")
    return search, candidate, tmp_path / "repo"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing search test says what became of every search it ran: each candidate's state
    and reason, each failed step's error and the last events (load-only failures show once)."""
    outcome = yield
    report = outcome.get_result()
    uses_db = item.get_closest_marker("django_db") or {"db", "transactional_db"} & set(item.fixturenames)
    if report.when != "call" or not report.failed or not uses_db:
        return
    try:
        from runtime_app.models import Event
        from search_app.models import Search, Step

        lines = []
        for search in Search.objects.all():
            lines.append(f"{search.search_id}: {fates(search)}")
            for step in Step.objects.filter(search=search).exclude(error=""):
                lines.append(f"  step {step.kind} r{step.round} {step.candidate}: {step.state}: {step.error}")
            events = Event.objects.filter(subject_type="search", subject_id=search.pk).order_by("-id")[:15]
            lines.extend(f"  event {event.kind}: {event.payload.get('message', '')}"
                         for event in reversed(events))
        if lines:
            report.sections.append(("what became of the searches", "\n".join(lines)))
    except Exception as error:  # the report of a failure must never fail itself
        report.sections.append(("what became of the searches", f"could not be read: {error}"))
