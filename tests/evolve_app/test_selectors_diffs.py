"""A cycle's diff on its page: made once by git, then read from the derived cache under the two
commits' SHAs, so a page under load does not run git again, and a moved tag is a new diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve_app import selectors, services
from evolve_app.history import EvolutionHistory
from evolve_app.models import Cycle
from tests.evolve_app.helpers import git

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cycle(personas, demo_agent):
    """Cycle 1 of a finished textbook run on the demo, read by its tags (no recorded commits)."""
    run = services.evolution_run_start(personas.owner, demo_agent, cycles=1, enqueue=False)
    services.evolution_run_execute(run.pk)
    cycle = Cycle.objects.get(run=run, number=1)
    cycle.pre_commit = cycle.post_commit = ""
    return cycle


@pytest.fixture
def git_diffs(monkeypatch):
    made = []
    real = EvolutionHistory.get_workspace_diff

    def counted(self, a, b, paths=()):
        made.append((a, b))
        return real(self, a, b, paths)

    monkeypatch.setattr(EvolutionHistory, "get_workspace_diff", counted)
    return made


def test_a_cycles_diff_is_made_by_git_once_and_then_read_from_the_cache(cycle, git_diffs):
    first = selectors.cycle_diff(cycle.run.agent, cycle)
    again = selectors.cycle_diff(cycle.run.agent, cycle)
    assert first == again and first["error"] == "" and "+++ b/skills/" in first["text"]
    assert git_diffs == [("pre-evo-1", "evo-1")]


def test_a_tag_moved_to_another_commit_gives_that_commits_diff(cycle, git_diffs):
    agent = cycle.run.agent
    assert "moved-tag-marker" not in selectors.cycle_diff(agent, cycle)["text"]
    root = Path(agent.path)
    (root / "memory" / "moved.jsonl").write_text('{"note": "moved-tag-marker"}\n')
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "more")
    git(root, "tag", "-f", "evo-1")
    assert "moved-tag-marker" in selectors.cycle_diff(agent, cycle)["text"]
    assert len(git_diffs) == 2
