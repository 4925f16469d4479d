"""EvolutionHistory: the seed's query facade over a workspace's versions, read from its git repo.

What lives in git is answered here: diffs between snapshots, a file at a snapshot, the log of
`evo-N` / `pre-evo-N` tags, what each cycle changed per layer, and rollback (a new commit, never
a rewrite). Observations come from the JSONL batches every cycle writes before its engine runs
(`evolution/observations/batch_<cycle>.jsonl`, by the Python Evolver and the services alike), so
`get_observations(last_n_cycles=2)` during cycle N holds cycles N-1 and N, as in A-Evolve; the
score curve comes from the run's recorded cycles. A-Evolve's other calls are here too:
`latest_cycle`, `list_versions`, `get_version_log`, `get_summary_stats`.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from dulwich.objects import Commit, Tag
from dulwich.refs import Ref

from evolve_app.models import Cycle
from evolve_app.workspace import (
    DEFAULT_AUTHOR,
    DRAFTS_DIR,
    EXCLUDED_DIR,
    WorkspaceError,
    workspace_changed_paths,
    workspace_git,
    workspace_ref_and_tree,
    workspace_rollback,
)
from evolve_app.workspace.snapshots import _ref, _repo
from evolve_app.workspace.validation import _root
from runtime_app.git import file_at

_SNAPSHOT_TAG = re.compile(r"(pre-)?evo-(\d{1,9})")
_BATCH_FILE = re.compile(r"batch_(\d{1,9})(?:_(\d{1,9}))?\.jsonl")  # batch_<cycle> (or <run>_<cycle>)
_SKILL_FILE = re.compile(r"skills/([^/]+)/SKILL\.md")
_DIFF_OPTIONS = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", "--src-prefix=a/",
                 "--dst-prefix=b/", "--unified=3", "--submodule=short")


class EvolutionHistory:
    """Versions of one workspace: `history = EvolutionHistory(path)`."""

    def __init__(self, path: str | Path):
        self.root = _root(path)

    def __repr__(self) -> str:
        return f"EvolutionHistory({str(self.root)!r})"

    def get_workspace_diff(self, a: str, b: str, paths: Sequence[str] = ()) -> str:
        """The unified git diff from ref `a` to ref `b` (optionally only under `paths`)."""
        base, head = self._resolve(a), self._resolve(b)
        for path in paths:
            _path_check(path)
        out = workspace_git(self.root, ["diff", *_DIFF_OPTIONS, base, head, "--", *paths])
        return out.decode("utf-8", "replace")

    def get_pending_diff(self, a: str) -> str:
        """The unified git diff from ref `a` to the files on disk, as a snapshot would commit them."""
        base, tree = workspace_ref_and_tree(self.root, a)
        return workspace_git(self.root, ["diff", *_DIFF_OPTIONS, base, tree]).decode("utf-8", "replace")

    def read_file_at(self, ref: str, path: str) -> str | None:
        """The text of `path` at `ref`, or None when no file is there (bytes that are not UTF-8
        are replaced)."""
        _path_check(path)
        repo = _repo(self.root)
        try:
            data = file_at(repo, _ref(repo, ref), path)
        finally:
            repo.close()
        return None if data is None else data.decode("utf-8", "replace")

    def version_log(self) -> list[dict[str, Any]]:
        """The snapshot tags in cycle order (evo-0, pre-evo-1, evo-1, pre-evo-2 ...): for each its
        tag, the commit sha, the tag's message (or the commit's), its date, cycle number and kind
        ("pre" or "post")."""
        repo = _repo(self.root)
        try:
            versions = []
            for ref in repo.refs.keys(base=Ref(b"refs/tags/")):
                name = ref.decode("utf-8", "replace")
                match = _SNAPSHOT_TAG.fullmatch(name)
                if not match:
                    continue
                obj = repo[repo.refs[Ref(b"refs/tags/" + ref)]]
                message, when, offset = "", None, 0
                if isinstance(obj, Tag):
                    message = obj.message.decode("utf-8", "replace").strip()
                    when, offset = obj.tag_time, obj.tag_timezone
                    while isinstance(obj, Tag):
                        obj = repo[obj.object[1]]
                if not isinstance(obj, Commit):
                    continue
                if when is None:
                    message = obj.message.decode("utf-8", "replace").strip().split("\n", 1)[0]
                    when, offset = obj.commit_time, obj.commit_timezone
                versions.append({
                    "tag": name, "sha": obj.id.decode(), "message": message,
                    "date": datetime.fromtimestamp(when, tz=timezone(timedelta(seconds=offset))),
                    "cycle": int(match.group(2)), "kind": "pre" if match.group(1) else "post",
                })
        finally:
            repo.close()
        return sorted(versions, key=lambda v: (v["cycle"], v["kind"] == "post"))

    def layer_changes(self, a: str, b: str) -> dict[str, Any]:
        """What changed from `a` to `b`, as the loop records per cycle: skills added, modified and
        deleted (a skill is modified when its SKILL.md or another file of its folder changed), the
        prompt's size in characters before and after and its change (`prompt_chars_delta`, also
        as `prompt_size_change`), and the number of changed files per layer."""
        changes = workspace_changed_paths(self.root, a, b)
        added: set[str] = set()
        deleted: set[str] = set()
        touched: set[str] = set()
        files = {"prompts": 0, "skills": 0, "memory": 0, "tools": 0, "other": 0}
        for status, path in changes:
            layer = path.split("/", 1)[0]
            files[layer if layer in files else "other"] += 1
            match = _SKILL_FILE.fullmatch(path)
            if match and not match.group(1).startswith("_"):
                {"A": added, "D": deleted}.get(status, touched).add(match.group(1))
            elif layer == "skills" and path.count("/") >= 2 and not path.split("/")[1].startswith("_"):
                touched.add(path.split("/")[1])
        before = self.read_file_at(a, "prompts/system.md") or ""
        after = self.read_file_at(b, "prompts/system.md") or ""
        after_skills = {name for name in touched
                        if self.read_file_at(b, f"skills/{name}/SKILL.md") is not None}
        return {
            "skills_added": sorted(added),
            "skills_modified": sorted(after_skills - added - deleted),
            "skills_deleted": sorted(deleted),
            "drafts_changed": sum(1 for _, path in changes if path.startswith(f"skills/{DRAFTS_DIR}/")),
            "prompt_chars_before": len(before),
            "prompt_chars_after": len(after),
            "prompt_chars_delta": len(after) - len(before),
            "prompt_size_change": len(after) - len(before),  # the seed's name for the same number
            "files_changed": files,
        }

    def rollback(self, ref: str, *, author: str = DEFAULT_AUTHOR, force: bool = False) -> str:
        """A new commit on top of HEAD whose tree equals `ref`'s ("Roll back to <ref>", trailer
        `Crucible-Rollback-To: <ref>`); history is kept. See workspace_rollback."""
        return workspace_rollback(self.root, ref, author=author, force=force)

    @staticmethod
    def score_curve(cycles: Iterable[Any]) -> list[tuple[int, float]]:
        """(cycle, score) pairs, in cycle order, from records with `number`/`cycle` and `score`
        attributes or keys (e.g. the run's Cycle rows); records without a score are skipped."""
        points = []
        for record in cycles:
            get = record.get if isinstance(record, dict) else lambda key, r=record: getattr(r, key, None)
            number = get("number") if get("number") is not None else get("cycle")
            score = get("score")
            if number is not None and score is not None:
                points.append((int(number), float(score)))
        return sorted(points)

    def get_observations(self, last_n_cycles: int | None = None,
                         only_failures: bool = False) -> list[dict[str, Any]]:
        """Observation records (seed format) of the last `last_n_cycles` cycles that wrote a batch
        (all when None), oldest cycle first; during a cycle its own batch is already there."""
        batches = self._batches()
        if last_n_cycles is not None:
            batches = batches[-last_n_cycles:] if last_n_cycles > 0 else []
        records = []
        for _, batch in batches:
            for line in batch.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and not (only_failures and record.get("success")):
                    records.append(record)
        return records

    def get_summary_stats(self) -> dict[str, Any]:
        """{total, success_rate, avg_score} over every recorded observation (A-Evolve's call)."""
        records = self.get_observations()
        if not records:
            return {"total": 0, "success_rate": 0.0, "avg_score": 0.0}
        scores = [float(r.get("score") or 0.0) for r in records]
        successes = sum(1 for r in records if r.get("success"))
        return {"total": len(records), "success_rate": successes / len(records),
                "avg_score": statistics.fmean(scores)}

    def get_score_curve(self) -> list[tuple[int, float]]:
        """(cycle, train score) of this agent's latest recorded run; without one (e.g. the Python
        Evolver alone), of every cycle that wrote an observation batch."""
        latest = Cycle.objects.filter(run__agent__path=str(self.root)).order_by("-run_id").first()
        if latest is not None:
            return self.score_curve(Cycle.objects.filter(run_id=latest.run_id))
        curve = []
        for number, batch in self._batches():
            scores = []
            for line in batch.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    scores.append(float(json.loads(line).get("score") or 0.0))
                except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
                    continue
            if scores:
                curve.append((number, round(statistics.fmean(scores), 6)))
        return curve

    @property
    def latest_cycle(self) -> int:
        """The highest cycle with an `evo-N` snapshot (0 before any): during cycle N, N-1."""
        return max((v["cycle"] for v in self.version_log() if v["kind"] == "post"), default=0)

    def list_versions(self) -> list[str]:
        """The `evo-N` tags, newest first (A-Evolve's call)."""
        return [v["tag"] for v in reversed(self.version_log()) if v["kind"] == "post"]

    def get_version_log(self, n: int = 30) -> str:
        """`git log --oneline` of the workspace, its last `n` commits (A-Evolve's call)."""
        out = workspace_git(self.root, ["log", "--oneline", "--no-decorate", f"-n{max(1, int(n))}"])
        return out.decode("utf-8", "replace")

    def _batches(self) -> list[tuple[int, Path]]:
        """(cycle, file) of each observation batch, by cycle; a cycle's batch_<cycle>.jsonl wins
        over an older batch_<run>_<cycle>.jsonl."""
        folder = self.root / EXCLUDED_DIR / "observations"
        found: dict[int, tuple[bool, Path]] = {}
        if folder.is_dir() and not folder.is_symlink():
            for entry in folder.iterdir():
                match = _BATCH_FILE.fullmatch(entry.name)
                if not match or entry.is_symlink() or not entry.is_file():
                    continue
                number = int(match.group(2) or match.group(1))
                newest = match.group(2) is None
                if number not in found or (newest and not found[number][0]):
                    found[number] = (newest, entry)
        return [(number, found[number][1]) for number in sorted(found)]

    def head(self) -> dict[str, Any]:
        """The commit HEAD names: its sha, its subject, and the ref a rollback commit restored
        (its `Crucible-Rollback-To` trailer), else ""."""
        repo = _repo(self.root)
        try:
            commit = repo[repo.head()]
        finally:
            repo.close()
        assert isinstance(commit, Commit)  # HEAD names a commit, never a tag or tree
        message = commit.message.decode("utf-8", "replace")
        restored = re.search(r"^Crucible-Rollback-To: (\S+)$", message, re.M)
        return {"sha": commit.id.decode(), "subject": message.strip().split("\n", 1)[0],
                "rolled_back_to": restored.group(1) if restored else ""}

    def _resolve(self, ref: str) -> str:
        repo = _repo(self.root)
        try:
            return _ref(repo, ref)
        finally:
            repo.close()


def _path_check(path: str) -> str:
    parts = path.split("/") if isinstance(path, str) else [""]
    if not path or path.startswith("-") or any(part in ("", ".", "..") for part in parts) or "\0" in path:
        raise WorkspaceError(f"{path!r}: give a relative path inside the workspace, like prompts/system.md")
    return path
