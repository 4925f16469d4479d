"""Search: candidate mutations by an inner engine on throwaway copies, each scored with the trial
runner; the best is applied."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from evolve_app.engines.adaptive import _accepts_guidance, _size_knob
from evolve_app.engines.base import EngineError, EvolutionEngine
from evolve_app.engines.model import _mean_score, _spread
from evolve_app.engines.registry import engine_get
from evolve_app.types import History, Observation, StepResult, Task, Trial, Workspace
from evolve_app.workspace import AgentWorkspace, WorkspaceError

# ---------------------------------------------------------------------------------------- search

_COPY_IGNORED = (".git", "evolution", "__pycache__")


def _layer_files(root: Path, layers: Iterable[str]) -> dict[str, bytes]:
    """{relative path: bytes} of the regular files under the given layer folders (no symlinks)."""
    files = {}
    for layer in layers:
        top = root / layer
        if not top.is_dir() or top.is_symlink():
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    return files


def workspace_delta(before: dict[str, bytes], after: dict[str, bytes]) -> dict[str, Any]:
    """What changed between two layer-file maps: written (added or modified), deleted, and the
    change's size as (files, bytes): the bytes of the written files plus those of deleted ones."""
    written = sorted(p for p in after if before.get(p) != after[p])
    deleted = sorted(p for p in before if p not in after)
    size = sum(len(after[p]) for p in written) + sum(len(before[p]) for p in deleted)
    return {"written": written, "deleted": deleted, "files": len(written) + len(deleted), "bytes": size}


def search_winner(candidates: list[dict[str, Any]], baseline: float) -> dict[str, Any] | None:
    """The best candidate: the highest score, ties going to the smallest change (files, then
    bytes), then the first; None unless it beats `baseline` (leaving the workspace as it is
    is the smallest change of all)."""
    scored = [c for c in candidates if c.get("score") is not None and c.get("files", 0) > 0]
    if not scored:
        return None
    best = min(scored, key=lambda c: (-c["score"], c["files"], c["bytes"], c["candidate"]))
    return best if best["score"] > baseline else None


class SearchEngine(EvolutionEngine):
    """The evolve step as an experimental search over candidate mutations.

    `n` throwaway copies of the workspace (without .git and evolution/) are each mutated by a
    fresh inner engine (`inner`, default textbook; other keyword options go to it): an inner
    engine with a size setting (SIZE_KNOBS, e.g. textbook's per_cycle) gets the values of
    `per_cycle_values` in turn ("1,2,3"; default 1..n), one whose step() takes `guidance`
    (skillforge) is told which candidate it is, any other runs as configured. Each copy is then
    scored by a TrialRunner pointed at it on the cycle's failed tasks plus up to `successes`
    of its passing ones (spread over the categories), so a mutation that breaks passing tasks
    loses. The best candidate wins (ties: the smallest change), if it beats the unchanged
    workspace on the same tasks (its score is the cycle's own); its changed files in the
    evolvable layers are copied back to the real workspace and the files it deleted deleted.
    A candidate whose inner engine raises is recorded with its error; if every one does, the
    step raises and the cycle fails.
    """

    name = "search"

    def __init__(self, inner: str = "textbook", n: int = 3, successes: int = 3, per_cycle_values: str = "",
                 *, trusted: bool = False, **inner_options: Any) -> None:
        self.options_check({"n": n, "per_cycle_values": per_cycle_values})
        self.inner_name, self.inner_options, self.trusted = inner, dict(inner_options), trusted
        self.n, self.successes = int(n), int(successes)
        self.per_cycle_values = self._values(per_cycle_values) or list(range(1, self.n + 1))
        engine_get(inner, trusted=trusted, **self.inner_options)  # a bad inner engine fails here, not later

    @classmethod
    def options_check(cls, options: Mapping[str, Any]) -> None:
        if not 1 <= int(options.get("n", 3)) <= 16:
            raise EngineError("search: n is 1 to 16 candidates")
        cls._values(options.get("per_cycle_values", ""))

    @staticmethod
    def _values(per_cycle_values: Any) -> list[int]:
        try:
            return [int(v) for v in str(per_cycle_values).replace(" ", "").split(",") if v]
        except ValueError:
            raise EngineError(f"search: per_cycle_values {per_cycle_values!r} is not a list like 1,2,3") \
                from None

    def _scratch(self) -> Path:
        try:
            base = Path(settings.DATA_DIR) / "evolve" / "search"
            base.mkdir(parents=True, exist_ok=True)
        except Exception:  # no Django settings: the system's temporary folder
            base = None
        return Path(tempfile.mkdtemp(prefix="search-", dir=base))

    def step(self, workspace: Workspace, observations: list[Observation], history: History,
             trial: Trial | None) -> StepResult:
        failed = [o for o in observations if not o.feedback.success]
        if not failed:
            return StepResult(False, "search: no failed tasks to search on", {"inner": self.inner_name})
        if trial is None:
            raise EngineError("search needs the loop's trial runner to score its candidates")
        judged = failed + _spread([o for o in observations if o.feedback.success], max(0, self.successes))
        tasks = [o.task for o in judged]
        baseline = _mean_score(judged)
        layers: list[str] = list(workspace.manifest.evolvable_layers)
        original = _layer_files(workspace.root, layers)
        candidates: list[dict[str, Any]] = []
        copies: dict[int, Path] = {}
        scratch = self._scratch()
        try:
            for index in range(self.n):
                copy = scratch / f"candidate-{index + 1}"
                shutil.copytree(workspace.root, copy, symlinks=True, ignore=lambda folder, names: [
                    name for name in names if Path(folder) == workspace.root and name in _COPY_IGNORED])
                copies[index + 1] = copy
                candidates.append(self._candidate(index, copy, observations, history, trial, tasks, original,
                                                  layers))
            if all(c.get("error") for c in candidates):
                raise EngineError(f"search: every candidate failed; the first: {candidates[0]['error']}")
            winner = search_winner(candidates, baseline)
            applied: dict[str, list[str]] = {"written": [], "deleted": []}
            if winner is not None:
                applied = self._apply(workspace, copies[winner["candidate"]], layers, original)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        metadata = {"inner": self.inner_name, "baseline": baseline,
                    "judged_tasks": [t.task_id for t in tasks], "candidates": candidates,
                    "winner": winner["candidate"] if winner else None,
                    "applied": applied}
        scores = ", ".join(f"#{c['candidate']} " + (f"{c['score']:.3f}" if c.get("score") is not None
                                                    else "failed" if c.get("error") else "no change")
                           for c in candidates)
        if winner is None:
            summary = f"search: no candidate beat the current workspace ({baseline:.3f}; {scores})"
        else:
            summary = (f"search: candidate {winner['candidate']} of {self.n} won ({scores}; baseline "
                       f"{baseline:.3f}): {winner['summary']}")
        return StepResult(winner is not None, summary[:500], metadata)

    def _candidate(self, index: int, copy: Path, observations: list[Observation], history: History,
                   trial: Trial, tasks: list[Task], original: dict[str, bytes],
                   layers: list[str]) -> dict[str, Any]:
        record: dict[str, Any] = {"candidate": index + 1, "setting": {}, "score": None, "files": 0,
                                  "bytes": 0}
        try:
            engine = engine_get(self.inner_name, trusted=self.trusted, **self.inner_options)
            inner_trial = trial.for_workspace(copy)  # the copy's agent, chosen with the run's trust
            knob = _size_knob(engine)
            if knob:
                setattr(engine, knob, self.per_cycle_values[index % len(self.per_cycle_values)])
                record["setting"] = {knob: getattr(engine, knob)}
                result = engine.step(AgentWorkspace(copy), observations, history, inner_trial)
            elif _accepts_guidance(engine):
                note = (f"This is candidate {index + 1} of {self.n} in a search: each candidate is scored on "
                        "the failed tasks and some passing ones, and the best is kept."
                        + (" Try a different approach from the most obvious one." if index else ""))
                record["setting"] = {"guidance": note}
                result = engine.step(AgentWorkspace(copy), observations, history, inner_trial, guidance=note)
            else:
                result = engine.step(AgentWorkspace(copy), observations, history, inner_trial)
        except Exception as error:  # one candidate's failure is a result of the search, not its end
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            return record
        delta = workspace_delta(original, _layer_files(copy, layers))
        record.update(summary=result.summary[:300], files=delta["files"], bytes=delta["bytes"])
        if delta["files"]:
            judged = trial.for_workspace(copy).run(tasks)
            record["passed"] = sum(1 for _, feedback in judged if feedback.success)
            record["score"] = round(sum(f.score for _, f in judged) / len(judged), 6) if judged else 0.0
        return record

    @staticmethod
    def _apply(workspace: Workspace, copy: Path, layers: list[str], original: dict[str, bytes]
               ) -> dict[str, list[str]]:
        """Copy the winner's changed layer files (content and mode) into the real workspace;
        delete the files it deleted, and the folders that leaves empty."""
        chosen = _layer_files(copy, layers)
        delta = workspace_delta(original, chosen)
        for rel in delta["written"]:
            target = workspace._path(rel)  # the workspace's own check: no path through a symlink
            if target.is_dir():
                raise WorkspaceError(f"{rel}: a directory is in the way")
            target.parent.mkdir(parents=True, exist_ok=True)
            workspace._path(rel)  # the folders just made are checked again
            temporary = target.with_name(f".{target.name}.search.tmp")
            temporary.write_bytes(chosen[rel])
            os.chmod(temporary, stat.S_IMODE((copy / rel).stat().st_mode))
            os.replace(temporary, target)
        for rel in delta["deleted"]:
            workspace._path(rel).unlink(missing_ok=True)
        for rel in delta["deleted"]:  # folders a deletion left empty
            folder = (workspace.root / rel).parent
            while folder != workspace.root and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
        return {"written": delta["written"], "deleted": delta["deleted"]}
