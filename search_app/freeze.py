"""Freezing: the canonical record of a search's inputs, its preregistration hash and id.

Search id and preregistration hash are SHA-256 over a canonical encoding (sorted-key
compact UTF-8 JSON) of: the baseline commit, the requested and resolved model ids, the
public evidence hash, the evaluator hash and the complete normalized spec. Same inputs give
the same ids on any machine; a change to any input changes both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dulwich.errors import NotTreeError
from dulwich.objects import SubmoduleEncountered
from dulwich.repo import Repo

from runtime_app.fleet import preset_efforts, preset_resolve_model
from runtime_app.git import GitError, file_at, is_tree, ref_resolve, repo_open, worktree_changes
from runtime_app.presenters import short_sha
from search_app.hidden import HiddenSnapshot, HostReport, hidden_snapshots, read_path_records
from search_app.spec import SearchSpec, SpecError, _locate, key_positions, spec_normalized, spec_validate

RECORD_FORMAT = "crucible-search/1"


class FreezeError(ValueError):
    """Freezing is impossible; `problems` say why, one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def evidence_record(
    spec: SearchSpec, contents: dict[str, bytes], read_paths: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Public evidence: files at the baseline, the notes and (only when declared, so every
    earlier id stays) what the worker's read paths held at freeze."""
    record: dict[str, Any] = {
        "files": [{"path": path, "sha256": sha256_hex(contents[path])} for path in spec.evidence.files],
        "text": spec.evidence.text,
    }
    if read_paths:
        record["read_paths"] = read_paths
    return record


def evaluator_record(
    spec: SearchSpec, hidden: Sequence[HiddenSnapshot] = (),
    read_paths: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """What judges candidates: gate and score commands, timeouts, hidden file contents (inline
    ones by path and hash, as always; host ones with their size and source too) and, only when
    declared, what the gates' and score's read paths held at freeze."""
    gates, score = spec.hard_gates, spec.score
    inline = [{"path": path, "sha256": sha256_hex(content.encode())}
              for path, content in spec.evaluator.inline().items()]
    scored: dict[str, Any] = {
        "command": score.command,
        "metric": score.metric,
        "direction": score.direction,
        "trials": score.trials,
        "timeout_seconds": score.timeout_seconds,
    }
    if score.reported is not None:  # what a reported figure measures decides how it is read and checked
        scored["reported"] = score.reported
    if score.results is not None:  # what every trial is checked on judges candidates too
        scored["results"] = spec.model_dump(mode="json")["score"]["results"]
    record = {
        "hard_gates": {"commands": list(gates.commands), "timeout_seconds": gates.timeout_seconds},
        "score": scored,
        "hidden_files": sorted([*inline, *(item.record() for item in hidden)], key=lambda item: item["path"]),
    }
    evaluated = {section: paths for section, paths in (read_paths or {}).items() if section != "worker"}
    if evaluated:
        record["read_paths"] = evaluated
    return record


def preregistration_record(
    *, baseline_commit: str, requested_model_id: str, resolved_model_id: str,
    public_evidence_hash: str, evaluator_hash: str, spec: dict[str, Any],
) -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "baseline_commit": baseline_commit,
        "requested_model_id": requested_model_id,
        "resolved_model_id": resolved_model_id,
        "public_evidence_hash": public_evidence_hash,
        "evaluator_hash": evaluator_hash,
        "spec": spec,
    }


def search_id_for(preregistration_hash: str) -> str:
    return "search-" + preregistration_hash[:16]


def candidate_batches(population: int, concurrency: int) -> list[list[str]]:
    """Candidate ids cand_001 … in admission batches of `concurrency`, fixed at freeze."""
    width = max(3, len(str(population)))
    ids = [f"cand_{n:0{width}d}" for n in range(1, population + 1)]
    return [ids[i : i + concurrency] for i in range(0, population, concurrency)]


@dataclass(frozen=True)
class FrozenInputs:
    spec: SearchSpec
    repository_path: str
    ref: str
    baseline_commit: str
    requested_model_id: str
    resolved_model_id: str
    model_resolution: str
    public_evidence_hash: str
    evaluator_hash: str
    record: dict[str, Any]
    preregistration_hash: str
    search_id: str
    candidate_batches: list[list[str]]
    evidence: dict[str, Any]
    evaluator: dict[str, Any]
    hidden: tuple[HiddenSnapshot, ...] = ()  # host hidden files, snapshotted with the search

    def hashed_inputs(self) -> dict[str, Any]:
        """Everything a reviewer needs to recompute both hashes."""
        return {
            "record": self.record,
            "record_canonical_json": canonical(self.record).decode(),
            "evidence": self.evidence,
            "evaluator": self.evaluator,
            "model_resolution": self.model_resolution,
        }


def _evidence_file(repo: Repo, commit: str, path: str) -> tuple[bytes | None, str]:
    """The bytes of an evidence file at the baseline, or None and why there are none."""
    try:
        data = file_at(repo, commit, path)
        if data is not None:
            return data, ""
        return None, "a directory; list its files" if is_tree(repo, commit, path) else "no such file"
    except NotTreeError:  # a path below a file
        return None, "no such file"
    except (KeyError, SubmoduleEncountered):  # a gitlink: its objects live in another repository
        return None, "inside a submodule; list files of this repository"


def spec_preset_defaults(spec: SearchSpec) -> SearchSpec:
    """A spec that sets no `reasoning_effort` takes its preset's effort defaults, frozen per round."""
    efforts = preset_efforts(spec.worker.provider, len(spec.rounds))
    if efforts is None or "reasoning_effort" in spec.worker.model_fields_set:
        return spec
    worker = spec.worker.model_copy(update={"reasoning_effort": efforts})
    return spec.model_copy(update={"worker": worker})


def freeze_inputs(spec_text: str, repository_path: str, ref: str) -> FrozenInputs:
    """Resolve and hash everything a search is frozen on; FreezeError lists what is wrong."""
    report = spec_validate(spec_text)
    if not report.valid:
        raise FreezeError([f"spec {error}" for error in report.errors])
    spec = report.spec
    assert spec is not None  # a report without errors carries its spec (spec_validate)
    try:
        repo = repo_open(repository_path)
    except GitError as error:
        raise FreezeError([str(error)]) from None
    try:
        try:
            commit = ref_resolve(repo, ref)
        except GitError as error:
            raise FreezeError([str(error)]) from None
        problems = []
        dirty = worktree_changes(repo)
        if dirty:
            shown = ", ".join(dirty[:5]) + (" …" if len(dirty) > 5 else "")
            problems.append(
                f"{repository_path}: the baseline is dirty — uncommitted changes to {shown}; "
                "commit or stash them first"
            )
        contents: dict[str, bytes] = {}
        for path in spec.evidence.files:
            data, missing = _evidence_file(repo, commit, path)
            if data is None:
                problems.append(f"evidence.files: {path}: {missing} at {short_sha(commit)}")
            else:
                contents[path] = data
        host, host_problems = host_inputs(spec, spec_text)
        problems += host_problems
        if problems:
            raise FreezeError(problems)
    finally:
        repo.close()
    spec = spec_preset_defaults(spec)
    requested = spec.worker.model or spec.worker.command
    resolved, resolution = preset_resolve_model(spec.worker.provider, requested)
    evidence = evidence_record(spec, contents, host.read_paths.get("worker"))
    evaluator = evaluator_record(spec, host.hidden, host.read_paths)
    evidence_hash = sha256_hex(canonical(evidence))
    evaluator_hash = sha256_hex(canonical(evaluator))
    record = preregistration_record(
        baseline_commit=commit, requested_model_id=requested, resolved_model_id=resolved,
        public_evidence_hash=evidence_hash, evaluator_hash=evaluator_hash,
        spec=spec_normalized(spec),
    )
    prereg = sha256_hex(canonical(record))
    return FrozenInputs(
        spec=spec, repository_path=str(repository_path), ref=ref, baseline_commit=commit,
        requested_model_id=requested, resolved_model_id=resolved, model_resolution=resolution,
        public_evidence_hash=evidence_hash, evaluator_hash=evaluator_hash, record=record,
        preregistration_hash=prereg, search_id=search_id_for(prereg),
        candidate_batches=candidate_batches(spec.population, spec.concurrency),
        evidence=evidence, evaluator=evaluator, hidden=tuple(host.hidden),
    )


def host_inputs(spec: SearchSpec, spec_text: str) -> tuple[HostReport, list[str]]:
    """Read the host files `spec` names (hidden evaluator files, read paths); each problem comes
    back as a line placed at its key, like every spec error."""
    report = HostReport()
    hidden_snapshots(spec, report)
    read_path_records(spec, report)
    positions = key_positions(spec_text) if report.problems else {}
    lines = []
    for key, message in report.problems:
        listed = key[1] == "read_paths"
        line, column = _locate(positions, key[:2] if listed else key)
        where = f"{key[0]}.read_paths[{key[2]}]" if listed else ".".join(key)
        lines.append(f"spec {SpecError(line, column, where, message)}")
    return report, lines
