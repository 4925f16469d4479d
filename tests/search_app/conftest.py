"""Fixtures shared by the search tests: the demo project and a small planned search."""

from __future__ import annotations

import dataclasses
import os

import pytest

from runtime_app import sandbox
from tests.helpers import service_missing

# Fixtures that tests outside tests/search_app use too live in fixtures.py.
from tests.search_app.fixtures import data_dir, demo, finished, reviewing  # noqa: F401
from tests.search_app.runs import fates, frozen


@pytest.fixture(autouse=True)
def provider_keys(monkeypatch):
    """A placeholder key for each cloud preset the test specs name (freezing refuses a provider
    without its key); tests of a missing key delete it again."""
    for variable in ("DEEPSEEK_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        if not os.environ.get(variable):
            monkeypatch.setenv(variable, "placeholder-key-for-tests")


@pytest.fixture
def small_search(personas, tmp_path, data_dir):  # noqa: F811 (data_dir: the fixture imported above)
    """A frozen two-candidate search of project alpha: cand_001 scores 4, cand_002 edits the tests."""
    return frozen(personas, tmp_path, {"cand_001": 4, "cand_002": "tests"}, repo_name="repo",
                  population=2, rounds=[2, 1])


@pytest.fixture
def bubblewrap(settings):
    """The real sandbox, required: a test of the truth boundary proves nothing under rlimits only
    (CRUCIBLE_REQUIRE_SERVICES turns the skip into a failure)."""
    available, reason = sandbox.bubblewrap_probe()
    if not available:
        service_missing(reason)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, sandbox="required")


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
