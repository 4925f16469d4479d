"""What a step knows of its frozen search, resolved once when the step starts: the spec, this
host's copy of the repository, the change policy's rules, what each section's commands may read.

Everything below a step (execution.py, the start-failure checks of preflight.py, the hidden files
an evaluation tree receives) takes a `StepContext` instead of deriving these from the Search row
again: the spec is validated once, the repository looked up (or its mirror fetched) once, and the
interpreters asked for the policy's import names once per step.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from runtime_app.interpreters import import_names
from runtime_app.mirrors import repository_local
from runtime_app.policy import PatchLimits, PolicyRules, command_script
from search_app.frozen import search_spec
from search_app.hidden import READ_SECTIONS, hidden_executable, hidden_files, readable_for
from search_app.spec import SearchSpec

if TYPE_CHECKING:
    from runtime_app.models import Project
    from search_app.models import Search


def policy_rules(spec: SearchSpec) -> PolicyRules:
    """The change policy's rules for a search, from its spec (runtime_app.policy knows no spec).

    The names no file of a patch may stand in for are asked of the interpreters the gates and
    the score run, in the sandbox (runtime_app.interpreters, cached); a probe that fails makes
    the policy refuse every file that could be imported by name, with the reason."""
    commands = (*spec.hard_gates.commands, spec.score.command)
    readable = [*readable_for(spec, "hard_gates"), *readable_for(spec, "score")]
    # Hidden files land in evaluation trees only: their directories (a hidden test's, a hidden
    # evaluator's) may be put on sys.path though the baseline does not have them.
    hidden = [path for item in spec.evaluator.files for path in (item, posixpath.dirname(item))]
    return PolicyRules(
        write_roots=tuple(spec.worker.write_roots),
        exact_files=tuple(spec.worker.exact_files),
        protected_paths=tuple(spec.hard_gates.protected_paths),
        score_script=command_script(spec.score.command),
        forbid_test_changes=spec.hard_gates.forbid_test_changes,
        max_patch_bytes=spec.worker.max_patch_bytes,
        max_patch_files=spec.worker.max_patch_files,
        commands=commands,
        import_dirs=tuple(dict.fromkeys(path for path in hidden if path)),
        import_names=import_names(commands, readable=list(dict.fromkeys(readable))),
    )


@dataclass(frozen=True)
class HiddenFiles:
    """The hidden evaluator files every evaluation tree of a search receives, as frozen (checked
    against their frozen hashes), and which of them are executable."""

    files: dict[str, bytes]
    executable: frozenset[str]


@dataclass(frozen=True)
class StepContext:
    """A frozen search as one step on this host sees it; made once by `step_context`."""

    search_pk: int
    search_id: str
    project: Project
    baseline_commit: str
    spec: SearchSpec
    repository: str  # the registered path when it holds the baseline here, else this host's mirror
    readable: dict[str, tuple[Path, ...]]  # by section ("worker", "hard_gates", "score")
    hidden_paths: tuple[str, ...]  # where hidden evaluator files land: read-only in every command
    search: Search = field(compare=False, repr=False)  # its hidden files' rows are read from it, lazily

    @property
    def git_dir(self) -> Path:
        """The repository's git dir: shown (read-only) to writers, whose worktree is a git worktree."""
        return Path(self.repository) / ".git"

    def readable_for(self, section: str) -> list[Path]:
        """What `section`'s commands may read besides their tree (hidden.readable_for, resolved)."""
        return list(self.readable[section])

    @cached_property
    def rules(self) -> PolicyRules:
        """The change policy's rules, made when the step first judges a patch (a round-0 writer's
        step never does: it needs only the patch limits, and the rules ask the interpreters)."""
        return policy_rules(self.spec)

    @property
    def limits(self) -> PatchLimits:
        """How much a writer's patch may change (from the spec alone)."""
        return PatchLimits(self.spec.worker.max_patch_bytes, self.spec.worker.max_patch_files)

    @cached_property
    def hidden(self) -> HiddenFiles:
        """Read from the database when the step's first evaluation tree needs them (never for a
        writer's step), then kept for the step's other trees."""
        return HiddenFiles(hidden_files(self.search, self.spec), frozenset(hidden_executable(self.search)))


def step_context(search: Search) -> StepContext:
    """Resolve, once, everything a step of `search` reads of its frozen search."""
    spec = search_spec(search)
    return StepContext(
        search_pk=search.pk, search_id=search.search_id, project=search.project,
        baseline_commit=search.baseline_commit, spec=spec,
        repository=repository_local(search.repository_path, search.baseline_commit,
                                    search_pk=search.pk, search_id=search.search_id),
        readable={section: tuple(readable_for(spec, section)) for section in READ_SECTIONS},
        hidden_paths=tuple(spec.evaluator.files),
        search=search,
    )
