"""The work of each step: write a candidate, evaluate it, replay it, review it.

Each function does the runtime's part — worktrees, the sandbox, the change policy, hidden
files, metrics — writes a receipt for everything it runs, and returns a StepResult
(search_app/step_result.py) that `services.step_execute` records in one transaction. Nothing here
changes a Candidate or a Step: a step that dies half-way leaves only receipts, and running it
again is safe.
"""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from django.conf import settings
from django.utils import timezone

from runtime_app import services as runtime_services
from runtime_app.egress import EgressError, EgressProxy
from runtime_app.fleet import Preset, preset_get
from runtime_app.git import GitError, file_at, repo_open
from runtime_app.lane import EXCLUSIVE, SHARED
from runtime_app.llm import LLMError, ToolChat
from runtime_app.metrics import MetricReading, last_json_line, metric_read
from runtime_app.models import Receipt
from runtime_app.policy import read_only_paths
from runtime_app.prices import Price, price_for, worst_case_microusd
from runtime_app.results import STDOUT, results_compare_all, results_digest, stdout_results
from runtime_app.sandbox import SYSTEM_DIRS, Limits, SandboxError
from runtime_app.services import ReceiptBatch
from runtime_app.tools import EDITOR_TOOL, SHELL_TOOL, tool_dispatch
from runtime_app.worktrees import (
    patch_extract,
    tree_remove,
    worktree_create,
    worktree_remove,
    worktrees_root,
)
from search_app.context import StepContext
from search_app.frozen import search_repository, search_spec
from search_app.hidden import hidden_files_write
from search_app.measurement import block_order
from search_app.models import Review, Search, SearchRun, Step
from search_app.preflight import search_start_failure
from search_app.spec import ResultsSpec, SearchSpec
from search_app.step_result import StepResult

LLM_KINDS = ("anthropic", "bedrock", "openai-compatible")
WRITER_TIMEOUT_SECONDS = 1800
REVIEW_TIMEOUT_SECONDS = 300
REVIEWER_SCRIPT = Path(__file__).resolve().parent / "reviewer.py"
BASELINE = "baseline"  # the baseline's member id in a block


def effort_for(spec: SearchSpec, round_index: int) -> str:
    effort = spec.worker.reasoning_effort
    if isinstance(effort, str):
        return effort
    return effort[min(round_index, len(effort) - 1)]


def writer_prompt(
    search: Search, spec: SearchSpec, candidate_id: str, round_index: int, refining: str = "",
    repository: str | None = None,
) -> str:
    """The shared prefix (identical for every candidate), then the candidate's own suffix."""
    return "".join(writer_prompt_parts(search, spec, candidate_id, round_index, refining, repository))


def writer_prompt_parts(
    search: Search, spec: SearchSpec, candidate_id: str, round_index: int, refining: str = "",
    repository: str | None = None,
) -> tuple[str, str]:
    """(prefix, suffix): the prefix is byte-identical for every candidate of a search (it is
    what a provider caches); the suffix carries the round, the effort, what a refining writer
    starts from and, last, the id. The evidence files are read from `repository` (a step's, from
    its context), or from the one this host resolves for the search."""
    allowed = [*spec.worker.write_roots, *spec.worker.exact_files]
    evidence = search.hashed_inputs.get("evidence", {})
    lines = [
        f"# Crucible search {search.search_id}: {spec.name}",
        "", "## Objective", spec.objective,
        "", "## Rules",
        f"- Change only these paths: {', '.join(allowed)}.",
        "- Tests, test configuration, protected paths, symlinks, binary files and mode changes are refused.",
        "- So is a module named like one the commands import from the standard library or an installed "
        "package (`json.py`, `pytest/`) where they import it from, packaging metadata (`*.dist-info`, "
        "`*.egg-info`, `*.pth`, `entry_points.txt`), bytecode and test-runner plugins.",
        f"- Protected: {', '.join(spec.hard_gates.protected_paths) or 'none beyond the defaults'}.",
        "- Your files are judged only by commands the runtime runs later; what you print is not evidence.",
        "", "## Evidence", spec.evidence.text or "(no notes)",
        *_evidence_files(search, evidence.get("files", []), repository),
        "", "## Response contract",
        "Edit the files in your working directory, then exit. Your patch is what changed there.",
        "Optionally print a last line of JSON with your usage: "
        '{"input_tokens": N, "output_tokens": N, "cost_microusd": N}.',
        "", "---", "",
    ]
    effort = effort_for(spec, round_index)
    suffix = f"Round {round_index}, effort {effort}. {refining}You are {candidate_id}.\n"
    return "\n".join(lines), suffix


EVIDENCE_FILE_LIMIT = 50_000


def _evidence_files(search: Search, files: list[dict], repository: str | None) -> list[str]:
    """Each public evidence file as it was at the baseline (checked against its frozen hash)."""
    lines: list[str] = []
    if not files:
        return lines
    with repo_open(repository or search_repository(search)) as repo:
        for item in files:
            data = file_at(repo, search.baseline_commit, item["path"]) or b""
            if hashlib.sha256(data).hexdigest() != item["sha256"]:
                lines.append(f"- {item['path']}: no longer matches its frozen hash; not shown")
                continue
            text = data[:EVIDENCE_FILE_LIMIT].decode(errors="replace")
            cut = " (first 50,000 bytes)" if len(data) > EVIDENCE_FILE_LIMIT else ""
            lines += ["", f"### {item['path']} at the baseline{cut}", "```", text.rstrip("\n"), "```"]
    return lines


def _worktree_name(step: Step, purpose: str) -> str:
    # The same name on every attempt: a retry first removes what a crashed attempt left.
    return f"{step.search.search_id}-{step.candidate.candidate_id}-{purpose}-r{step.round}"


def _fresh_worktree_path(repo: str, name: str) -> None:
    """Remove a writer's worktree a crashed earlier attempt left under this name."""
    leftover = worktrees_root() / name
    if leftover.exists() or leftover.is_symlink():
        worktree_remove(repo, leftover)


def _fresh_tree_path(name: str) -> None:
    """Remove a plain tree a crashed earlier attempt left under this name (and its parked record)."""
    leftover = worktrees_root() / name
    _parked_record(leftover).unlink(missing_ok=True)  # first: a record never outlives its tree
    if leftover.exists() or leftover.is_symlink():
        tree_remove(leftover)


# An evaluation tree whose gates all passed is kept ("parked") on its host for the trials of
# its candidate, and a round's trial trees for the next round's, so `measure` need not check the
# same baseline + patch + hidden files out again. No command ever runs in a parked tree (each
# gets a throwaway overlay or copy of it). Its record sits beside it in the worktrees root,
# outside every sandbox's view, written only once the tree is complete and removed before it.
# What no trial will take is removed: after a round's trials, when the search ends (on the host
# that ends it), and by each worker host's own sweep (parked_trees_sweep), for the trees a host
# parked when the trials ran on another. A search whose writers refine (`worker.refine`) parks
# nothing: its later rounds start with writers, and no hidden file may exist in any tree while a
# writer of the same search runs, on any host (trees_park).
PARKED_SUFFIX = ".parked.json"


def trees_park(spec: SearchSpec) -> bool:
    """Whether a search's evaluation trees may be kept past the step that built them: not when
    writers run again after its evaluations (refinement), since a tree parked on one host
    outlives that step until another host's trials take it or its sweep removes it."""
    return not spec.worker.refine


@dataclass(frozen=True)
class ParkedTree:
    tree: Path
    read_only: list[str]
    apply_receipt: int | None  # the receipt of the apply that built it


def _parked_record(tree: Path) -> Path:
    return tree.with_name(tree.name + PARKED_SUFFIX)


def _tree_park(step: Step, candidate_id: str, tree: Path, read_only: list[str], patch_sha256: str,
               apply_receipt: int | None) -> bool:
    """Record `tree` as parked for `candidate_id`'s trials from this round on; False if it could not
    be (an unrecorded tree is then removed)."""
    record = {"search": step.search.search_id, "round": step.round, "candidate": candidate_id,
              "patch_sha256": patch_sha256, "baseline": step.search.baseline_commit,
              "read_only": read_only, "apply_receipt": apply_receipt, "step": step.pk}
    temporary = tree.with_name(tree.name + ".parking")
    try:
        temporary.write_text(json.dumps(record))
        temporary.replace(_parked_record(tree))  # whole or absent, whatever kills this process
    except OSError:
        temporary.unlink(missing_ok=True)
        return False
    return True


def _parked_records(search: Search | None = None, candidate_id: str = "*") -> list[tuple[Path, dict]]:
    """This host's parked trees (of `search`, of one of its candidates), with their records."""
    root = worktrees_root()
    pattern = "*" if search is None else (
        f"{glob.escape(search.search_id)}-{glob.escape(candidate_id) if candidate_id != '*' else '*'}-*")
    found = []
    for path in sorted(root.glob(pattern + PARKED_SUFFIX)) if root.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
        found.append((path.with_name(path.name.removesuffix(PARKED_SUFFIX)),
                      record if isinstance(record, dict) else {}))
    return found


def _tree_parked(step: Step, member: Any) -> ParkedTree | None:
    """A tree parked on this host for `member` that holds exactly its current patch over this
    search's baseline (from its evaluation, or the previous round's trials), or None."""
    digest = hashlib.sha256(bytes(member.patch)).hexdigest()
    for tree, record in _parked_records(step.search, member.candidate_id):
        if (record.get("candidate") == member.candidate_id and record.get("patch_sha256") == digest
                and record.get("baseline") == step.search.baseline_commit
                # Parked this round or the one before: older ones are the hosts' sweeps' to remove.
                and isinstance(record.get("round"), int) and step.round - 1 <= record["round"] <= step.round
                and isinstance(record.get("read_only"), list) and tree.is_dir() and not tree.is_symlink()):
            return ParkedTree(tree, [str(path) for path in record["read_only"]], record.get("apply_receipt"))
    return None


def parked_trees_remove(search: Search, *, rounds_before: int | None = None) -> int:
    """Remove this host's parked trees of `search` (only those last parked in a round before
    `rounds_before`, if given: trees no trial of that round took); returns how many."""
    removed = 0
    for tree, record in _parked_records(search):
        parked_in = record.get("round")
        if rounds_before is not None and isinstance(parked_in, int) and parked_in >= rounds_before:
            continue
        _parked_record(tree).unlink(missing_ok=True)
        if tree.exists() or tree.is_symlink():
            tree_remove(tree)
        removed += 1
    return removed


def parked_trees_sweep() -> int:
    """Remove this host's parked trees that no trial will take any more: their search is no
    longer running (or is gone), or has moved two rounds past the round they were parked in
    (their trials ran on another host). Returns how many; a worker host calls it every few seconds."""
    records = _parked_records()
    if not records:
        return 0
    searches = {search.search_id: search for search in
                Search.objects.filter(search_id__in={record.get("search") for _, record in records})
                .select_related("run")}
    removed = 0
    for tree, record in records:
        search = searches.get(record.get("search", ""))
        run = getattr(search, "run", None) if search is not None else None
        parked_in = record.get("round")
        # Only a round's trials take a parked tree: none once the rounds are over (replay, review,
        # a revision's writer) or when the search's writers refine.
        if search is not None and run is not None and run.status == SearchRun.Status.RUNNING \
                and run.phase == SearchRun.Phase.ROUNDS \
                and (not isinstance(parked_in, int) or parked_in >= run.round_index - 1) \
                and trees_park(search_spec(search)):
            continue
        _parked_record(tree).unlink(missing_ok=True)
        if tree.exists() or tree.is_symlink():
            tree_remove(tree)  # a plain tree: no repository to find, none to lock
        removed += 1
    return removed


def _record(receipt: Receipt, step: Step, label: str) -> Receipt:
    return runtime_services.receipt_record(
        receipt, project=step.search.project, subject=("candidate", step.candidate_id), label=label
    )


def _run(step: Step, command: Sequence[str] | str, label: str, *, cwd: Path, timeout: float,
         cancel: threading.Event, env: dict[str, str] | None = None, stdin: bytes = b"",
         writable: bool = True, readable: Sequence[Path] = (), kind: str = "command",
         limits: Limits | None = None, fresh: bool = False, read_only: Sequence[str] = (),
         metrics_file: Path | None = None, lane: str = SHARED, subject: int | None = None,
         note: dict[str, Any] | None = None, egress: EgressProxy | None = None,
         pending: ReceiptBatch | None = None, results: TrialResults | None = None,
         report_file: Path | None = None) -> Receipt:
    """A command in the sandbox for this step, with its receipt on the candidate's page (or on
    `subject`'s, the candidate a measurement trial is for); `note` is added to its detail. With
    `pending`, the receipt is written with that batch (its pk is None until then). With `results`,
    the trial's stdout and results files are handed back to its folder. The command sees its tree
    and `readable` only: a writer is shown its repository's git dir by its caller (its worktree is a
    git worktree); an evaluation, trial, replay or review tree is a plain directory and its
    commands see no repository at all."""
    subject_pk = subject or step.candidate_id
    try:
        return runtime_services.command_run(
            command, cwd=cwd, timeout=timeout, env=env, stdin=stdin, writable=writable, kind=kind,
            readable=list(readable), cancel=cancel, limits=limits, project=step.search.project,
            subject=("candidate", subject_pk), label=label, fresh=fresh, read_only=read_only,
            metrics_file=metrics_file, lane=lane, note=note, egress=egress, pending=pending,
            **(results.run_options() if results is not None else {}),
            **({} if report_file is None else {"report_file": report_file}),
        )
    except SandboxError as error:  # refused before it ran (e.g. bubblewrap required): say so
        now = timezone.now()
        receipt = Receipt(kind=kind, argv=[command] if isinstance(command, str) else list(command),
                          started_at=now, finished_at=now, duration_seconds=0, error=str(error),
                          detail=note or {})
        return runtime_services.receipt_record(receipt, project=step.search.project,
                                               subject=("candidate", subject_pk), label=label,
                                               pending=pending)


def _usage(receipt: Receipt) -> dict[str, int]:
    data, _ = last_json_line(receipt.stdout_excerpt)
    if data is None:
        return {}
    usage = {}
    for name in ("input_tokens", "output_tokens", "cost_microusd", "tokens"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            usage[name] = value
    if "tokens" not in usage and ("input_tokens" in usage or "output_tokens" in usage):
        usage["tokens"] = usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
    return usage


# ------------------------------------------------------------------------------------ generate


def previous_score(candidate: Any) -> float | None:
    """The metric's value a candidate last measured (its absolute median)."""
    return candidate.score_absolute if candidate.score_absolute is not None else candidate.score


def refine_note(search: Search, spec: SearchSpec, candidate: Any) -> str:
    """What a refining writer starts from: its patch (already applied) and how it scored."""
    # The values as measured (a paired figure is a ratio; the writer wants the metric itself).
    measured_row = search.candidates.filter(number=0).values_list("score_absolute", "score").first()
    baseline = next((value for value in measured_row or () if value is not None), None)
    against = f"; the baseline scored {baseline:g}" if baseline is not None else ""
    measured = previous_score(candidate)
    score = f"{measured:g}" if measured is not None else "no score"
    return (f"Your patch from round {candidate.patch_round} is already applied in your working directory. "
            f"It scored {score} on {spec.score.metric} ({spec.score.direction}{against}). "
            "Improve it, or leave the files as they are to keep it. ")


def generate(step: Step, context: StepContext, cancel: threading.Event) -> StepResult:
    """Run the writer in its own worktree; once it has ended, extract its patch.

    In round 0 the worktree is the baseline. A later round's generate step is a refinement: the
    candidate's patch is applied first (and judged again by the change policy), and whatever
    the writer leaves is its new patch against the baseline.
    """
    name = _worktree_name(step, "write")
    _fresh_worktree_path(context.repository, name)
    receipts: list[int] = []
    prepared = _writer_tree(step, context, name, receipts)
    if isinstance(prepared, StepResult):
        return prepared
    worktree, refining = prepared
    try:
        ran = _write(step, context, worktree, cancel, refining, receipts)
        if isinstance(ran, StepResult):
            return ran
        written, writer = ran
        written["receipts"] = receipts + written["receipts"]
        if writer.detail.get("cancelled"):
            return StepResult(cancelled=True, receipts=written["receipts"])
        # The writer's processes are gone (the sandbox killed its group and cgroup): its tree
        # is frozen, so the patch extracted now is final.
        try:
            patch = patch_extract(worktree, limits=context.limits)
        except GitError as error:
            return StepResult(eliminated=f"its patch could not be extracted: {error}",
                              receipts=written["receipts"], usage=written["usage"])
    finally:
        worktree_remove(context.repository, worktree)
    return StepResult(
        receipts=written["receipts"], writer_outcome=writer.outcome, usage=written["usage"],
        stop=written.get("stop", ""), transcript=written.get("transcript", []),
        patch_sha256=patch.sha256, diff_lines=patch.diff_lines, files=patch.files[:200],
        refining=refining,
        eliminated=f"the writer ({writer.outcome}) changed nothing" if patch.empty else None,
        patch_hex=patch.text.hex(),
    )


def _writer_tree(step: Step, context: StepContext, name: str, receipts: list[int]
                 ) -> tuple[Path, str] | StepResult:
    """The writer's worktree and the note it starts from: the baseline in round 0; in a refinement,
    the candidate's patch applied (its apply receipt goes to `receipts`), or the step's result when
    the patch cannot be set up again."""
    search, candidate = step.search, step.candidate
    if not step.refines:
        return worktree_create(context.repository, context.baseline_commit, name), ""
    refining = refine_note(search, context.spec, candidate)
    if "revision" in step.plan:  # sent back by a person: the reviewers' requests come first
        refining = (f"Your patch won this search and is already applied in your working directory. "
                    f"{step.plan['feedback']}")
    worktree, admit = runtime_services.patch_admit(
        context.repository, context.baseline_commit, bytes(candidate.patch), name,
        context.rules, project=context.project, subject=("candidate", candidate.pk),
        label=f"{candidate.candidate_id} r{step.round} refine apply",
    )
    receipts.append(admit.pk)
    if worktree is None:
        return StepResult(eliminated=f"its patch could not be set up for refinement: "
                                     f"{admit.detail['reason']}", receipts=receipts)
    return worktree, refining


def _worker_preset(spec: SearchSpec) -> Preset:
    """The writers' preset; one an administrator removed since the freeze fails the step."""
    preset = preset_get(spec.worker.provider)
    if preset is None:
        raise ValueError(f"worker.provider {spec.worker.provider!r} is no longer one of the fleet presets")
    return preset


def _writer_env(step: Step, spec: SearchSpec) -> dict[str, str]:
    """What a command or agent-CLI writer is told through its environment."""
    search, candidate = step.search, step.candidate
    env = {
        "CRUCIBLE_CANDIDATE_ID": candidate.candidate_id, "CRUCIBLE_ROUND": str(step.round),
        "CRUCIBLE_EFFORT": effort_for(spec, step.round), "CRUCIBLE_SEARCH_ID": search.search_id,
        "CRUCIBLE_MAX_COST_MICROUSD": str(step.reserved_cost_microusd),
        "CRUCIBLE_MAX_TOKENS": str(step.reserved_tokens),
    }
    if step.refines:
        env["CRUCIBLE_REFINE"] = "1"
        if "revision" in step.plan:
            env["CRUCIBLE_REVISION"] = str(step.plan["revision"])
        measured = previous_score(candidate)
        env["CRUCIBLE_PREVIOUS_SCORE"] = "" if measured is None else f"{measured:g}"
    return env


def _write(step: Step, context: StepContext, worktree: Path, cancel: threading.Event, refining: str,
           receipts: list[int]) -> tuple[dict[str, Any], Receipt] | StepResult:
    """The writer of the spec's provider kind, run in `worktree`: (what it wrote, its receipt), or
    the step's result when the writer ended the step (cancelled, cannot start, no such kind)."""
    search, candidate, spec = step.search, step.candidate, context.spec
    env = _writer_env(step, spec)
    kind = _worker_preset(spec).kind
    if kind in LLM_KINDS:
        written = llm_write(step, context, worktree, cancel, refining)
        if written.get("cancelled"):
            return StepResult(cancelled=True, receipts=written["receipts"])
        writer = written.pop("receipt")
    elif kind == "command":
        prompt = writer_prompt(search, spec, candidate.candidate_id, step.round, refining, context.repository)
        writer = _run(step, spec.worker.command, f"{candidate.candidate_id} writer", cwd=worktree,
                      timeout=WRITER_TIMEOUT_SECONDS, cancel=cancel, env=env, stdin=prompt.encode(),
                      readable=[context.git_dir, *context.readable_for("worker")])
        written = {"usage": _usage(writer), "receipts": [writer.pk]}
        # A writer that cannot start stops the search (search_app/preflight.py), not just this candidate.
        failure = search_start_failure(context, writer, "worker.command", spec.worker.command)
        if failure:
            return failure.result(receipts=receipts + written["receipts"], usage=written["usage"])
    elif kind == "agent-cli":
        written = agent_cli_write(step, context, worktree, cancel, env, refining)
        writer = written.pop("receipt")
    else:
        return StepResult(eliminated=f"provider kind {kind!r} has no writer in this version of "
                                     "Crucible (anthropic and command workers run today)")
    return written, writer


# ------------------------------------------------------------------------------------ evaluate


def _evaluation_tree(step: Step, context: StepContext, candidate: Any, purpose: str, label: str,
                     pending: ReceiptBatch | None = None) -> tuple[Path | None, Receipt, list[str]]:
    """A pristine evaluation tree: a fresh baseline checkout, the candidate's patch (judged by the
    change policy) and the hidden evaluator files, which arrive only now. Commands never run in
    it directly: each gets a throwaway copy (`fresh`), with `read_only` paths bound read-only.
    Returns (tree or None, the apply receipt, the read-only paths); with `pending`, the apply
    receipt is written with that batch."""
    name = f"{context.search_id}-{candidate.candidate_id}-{purpose}-r{step.round}"
    _fresh_tree_path(name)
    worktree, admit = runtime_services.patch_admit(
        context.repository, context.baseline_commit, bytes(candidate.patch), name,
        context.rules, project=context.project, subject=("candidate", candidate.pk),
        label=f"{label} apply", pending=pending, plain=True,
    )
    if worktree is None:
        return None, admit, []
    try:
        hidden = context.hidden  # the frozen snapshot (search_app/hidden.py), read once per step
        hidden_files_write(worktree, hidden.files, hidden.executable)
        files = [str(path.relative_to(worktree)) for path in worktree.rglob("*") if path.is_file()]
    except BaseException:
        tree_remove(worktree)
        raise
    return worktree, admit, read_only_paths(files, context.rules, extra=list(context.hidden_paths))


def _gates(step: Step, context: StepContext, tree: Path, read_only: list[str], label: str,
           cancel: threading.Event, pending: ReceiptBatch) -> list[tuple[int, str, Receipt]]:
    """Run the hard gates in order, each on a fresh copy of the pristine tree, until one fails
    or is cancelled; `pending` is written after each. Returns (number, command, receipt) each."""
    ran = []
    spec = context.spec
    for number, command in enumerate(spec.hard_gates.commands, start=1):
        gate = _run(step, command, f"{label} gate {number}", cwd=tree, cancel=cancel,
                    timeout=spec.hard_gates.timeout_seconds, fresh=True, read_only=read_only,
                    readable=context.readable_for("hard_gates"), pending=pending)
        pending.write()  # each gate's receipt as it ends (the first with the apply receipt)
        ran.append((number, command, gate))
        if gate.detail.get("cancelled") or not gate.succeeded:
            break
    return ran


def _gates_judged(context: StepContext, ran: list[tuple[int, str, Receipt]], receipts: list[int]
                  ) -> StepResult | None:
    """None if every gate that ran passed, else the step's result (eliminated or cancelled); the
    gates' receipts are written by now, so their numbers can be named."""
    receipts += [gate.pk for _, _, gate in ran]
    for number, command, gate in ran:
        if gate.detail.get("cancelled"):
            return StepResult(cancelled=True, receipts=receipts)
        # Cannot start: the spec's failure (stop the search), or a script its patch deleted.
        failure = search_start_failure(context, gate, f"hard_gates.commands[{number - 1}]", command)
        if failure:
            return failure.result(receipts=receipts, gates_passed=number - 1)
        if not gate.succeeded:
            return StepResult(eliminated=f"gate {number} `{command}` {gate.outcome} (receipt #{gate.pk})",
                              receipts=receipts, gates_passed=number - 1)
    return None


# A member's pristine tree built earlier in the same step: (tree, read-only paths, apply receipt).
HeldTree = tuple[Path, list[str], int | None]


def _gated(step: Step, context: StepContext, purpose: str, label: str, cancel: threading.Event, *,
           park: bool = False, hold: dict[str, HeldTree] | None = None
           ) -> tuple[StepResult | None, list[int]]:
    """The candidate's pristine evaluation tree and its gates in order; (the step's result if it
    stopped there, the receipts). The tree is removed, unless every gate passed and `park` (then
    it is kept for the round's trials on this host) or `hold` (then it goes there, for this same
    step's trials: a replay). The apply receipt is written with the first gate's, in one
    transaction, and whatever happens on the way."""
    candidate = step.candidate
    batch = ReceiptBatch()
    ran: list[tuple[int, str, Receipt]] = []
    kept = False
    try:
        tree, admit, read_only = _evaluation_tree(step, context, candidate, purpose, label, pending=batch)
        if tree is not None:
            try:
                ran = _gates(step, context, tree, read_only, label, cancel, batch)
                kept = (park or hold is not None) and len(ran) == len(context.spec.hard_gates.commands) \
                    and all(gate.succeeded and not gate.detail.get("cancelled") for _, _, gate in ran)
            finally:
                if not kept:
                    tree_remove(tree)
    finally:
        batch.write()
    receipts = [admit.pk]
    if tree is None:
        return StepResult(eliminated=f"patch refused at {admit.detail['stage']}: {admit.detail['reason']}",
                          receipts=receipts), receipts
    judged = _gates_judged(context, ran, receipts)
    if kept and judged is None and hold is not None:
        hold[candidate.candidate_id] = (tree, read_only, admit.pk)
    elif kept and not (judged is None and _tree_park(step, candidate.candidate_id, tree, read_only,
                                                     admit.detail.get("patch_sha256", ""), admit.pk)):
        tree_remove(tree)
    return judged, receipts


def evaluate(step: Step, context: StepContext, cancel: threading.Event) -> StepResult:
    """Fresh baseline + the patch, change policy, hidden files, then the gates in order. Trials
    run later, in the round's measurement blocks (`measure`)."""
    spec = context.spec
    label = f"{step.candidate.candidate_id} r{step.round} {step.kind}"
    stopped, receipts = _gated(step, context, step.kind, label, cancel, park=trees_park(spec))
    return stopped or StepResult(receipts=receipts, gates_passed=len(spec.hard_gates.commands))


# ------------------------------------------------------------------------------------- measure


@dataclass
class TrialResults:
    """Where one trial's results come back to the worker (its stdout and each results file the
    spec names), in a folder of its own, removed before the block's receipts are written."""

    folder: Path
    checked: ResultsSpec

    @classmethod
    def make(cls, scratch: Path, checked: ResultsSpec) -> TrialResults:
        folder = scratch / f"results-{uuid.uuid4().hex}"
        folder.mkdir(mode=0o700)
        return cls(folder, checked)

    def run_options(self) -> dict[str, Any]:
        files = {path: self.folder / f"file-{n}" for n, path in enumerate(self.checked.files)}
        stdout = self.folder / "stdout" if self.checked.stdout else None
        return {"stdout_file": stdout, "results_files": files}

    def read(self, trial: Receipt, metric: str) -> tuple[dict[str, bytes | None] | None, str]:
        """({result: its bytes, or None when not written}, "") or (None, why there are none)."""
        if trial.error:
            return None, f"the trial did not run ({trial.error})"
        found: dict[str, bytes | None] = {}
        if self.checked.stdout:
            said = trial.detail.get("stdout_file", "")
            if said != "whole":
                return None, f"its stdout was {said or 'not kept'} (results are compared whole)"
            found[STDOUT] = stdout_results((self.folder / "stdout").read_bytes(), metric)
        states = trial.detail.get("results_files", {})
        for n, path in enumerate(self.checked.files):
            said = states.get(path, "not written")
            if said.startswith("cut"):
                return None, f"its results file `{path}` was {said} (results are compared whole)"
            found[path] = (self.folder / f"file-{n}").read_bytes() if said == "written" else None
        return found, ""

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _trial_source(spec: SearchSpec) -> str:
    """Where a trial's metric comes from, as its receipt says."""
    if spec.score.runtime_measured:
        return "runtime"
    if spec.score.reported == "other":
        return "the report descriptor (CRUCIBLE_REPORT_FD) only"
    return "reported by the score command" + (", checked against the runtime's measurement"
                                              if spec.score.corroborated else "")


def _trial(step: Step, context: StepContext, member: Any, tree: Path, read_only: list[str], label: str,
           cancel: threading.Event, block: int, position: int, scratch: Path, pending: ReceiptBatch,
           results: TrialResults | None = None) -> tuple[Receipt, TrialFiles]:
    """One timing trial in the exclusive lane, on a fresh copy of the member's pristine tree; its
    receipt goes to `pending`. Returns it and the files its metrics and its report descriptor
    were written to, if any; its results come back to `results`, when the spec checks them. A
    figure of another kind (`reported = "other"`) gets no metrics file: it is read only from the
    report descriptor."""
    spec = context.spec
    reported = not spec.score.runtime_measured
    files = TrialFiles(
        scratch / f"metrics-{uuid.uuid4().hex}.json" if reported and spec.score.reported != "other" else None,
        scratch / f"report-{uuid.uuid4().hex}.json" if spec.score.reported is not None else None)
    trial = _run(step, spec.score.command, f"{label} trial block {block}", cwd=tree,
                 timeout=spec.score.timeout_seconds, cancel=cancel, fresh=True, read_only=read_only,
                 readable=context.readable_for("score"), metrics_file=files.metrics, lane=EXCLUSIVE,
                 subject=member.pk, pending=pending, results=results, report_file=files.report,
                 note={"block": block, "position": position, "round": step.round,
                       "measures": member.candidate_id, "metric": spec.score.metric,
                       "metric_source": _trial_source(spec)})
    return trial, files


def _trial_reading(spec: SearchSpec, trial: Receipt, files: TrialFiles) -> MetricReading:
    """The metric a written trial measured; its files are removed."""
    try:
        return metric_read(trial, spec.score.metric, files.metrics, report_file=files.report,
                           descriptor_only=spec.score.reported == "other")
    finally:
        for path in files:
            if path is not None:
                path.unlink(missing_ok=True)


class TrialFiles(NamedTuple):
    """Where a trial's $CRUCIBLE_METRICS_FILE and its report descriptor were written, if anywhere."""

    metrics: Path | None
    report: Path | None


# A block's trial: the member it measured, its receipt, the files its metrics were written to.
Trial = tuple[str, Receipt, TrialFiles]


def measure(step: Step, context: StepContext, cancel: threading.Event,
            held: dict[str, HeldTree] | None = None) -> StepResult:
    """Run blocks `plan.blocks` of a round for `plan.members` (candidate ids, the baseline
    among them): in each block every member runs one trial, in the block's seeded order, with no
    other command of this host running at the same time. A member whose trial fails (or whose
    tree cannot be rebuilt) leaves the later blocks and is reported. `held`: members' trees this
    step built already (a replay's gated tree), taken instead of building them again."""
    search, spec = step.search, context.spec
    first, last = step.plan["blocks"]
    members = {candidate.candidate_id: candidate for candidate in
               search.candidates.filter(candidate_id__in=step.plan["members"])}
    namespace = step.plan.get("namespace", step.round)
    trees: dict[str, tuple[Path, list[str]]] = {}
    receipts: list[int] = []
    values: dict[str, dict[str, float]] = {cid: {} for cid in members}
    durations: dict[str, dict[str, float]] = {cid: {} for cid in members}
    measured: dict[str, dict[str, dict[str, float]]] = {"cpu": {cid: {} for cid in members},
                                                         "rss": {cid: {} for cid in members}}
    dropped: dict[str, str] = {}
    built_by: dict[str, Any] = {}  # each member's tree: the apply receipt that built it (its pk once written)
    parked_from: list[str] = []  # members whose tree was parked (by their evaluation or earlier trials)
    scratch = worktrees_root().parent / "sandbox"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        receipts += _member_trees(step, context, members, trees, built_by, parked_from, dropped, held or {})
        for block in range(first, last):
            running = [cid for cid in trees if cid not in dropped]
            order = block_order(search.search_id, namespace, block, running)
            ran, stopped = _block_trials(step, context, members, trees, order, block, cancel, scratch)
            receipts += [trial.pk for _, trial, _ in ran]
            ended = _block_judged(context, ran, block, receipts, values, durations, dropped, measured)
            if ended is not None:
                return ended
            if stopped:
                return StepResult(cancelled=True, receipts=receipts)
    finally:
        keep = step.kind == Step.Kind.MEASURE and not cancel.is_set() and trees_park(spec)
        _trees_release(step, context, members, trees, built_by, keep=keep, dropped=dropped)
    return StepResult(receipts=receipts, values=values, durations=durations, dropped=dropped,
                      cpu=measured["cpu"], rss=measured["rss"],
                      blocks=[first, last], members=sorted(members),
                      trees_parked_before=sorted(parked_from) if parked_from else None)


def _member_trees(step: Step, context: StepContext, members: dict[str, Any],
                  trees: dict[str, tuple[Path, list[str]]], built_by: dict[str, Any], parked_from: list[str],
                  dropped: dict[str, str], held: dict[str, HeldTree]) -> list[int]:
    """Each member's pristine tree: a parked one, or a fresh checkout with its patch; filled into
    `trees`, `built_by`, `parked_from` and `dropped` as it goes (the caller releases whatever was
    built, even when this fails half-way). Returns the apply receipts written. The members' apply
    receipts are one batch: one write transaction, written whatever happens on the way."""
    batch = ReceiptBatch(tails_wait=False)
    admits = []
    try:
        for cid, member in sorted(members.items()):
            label = f"{cid} r{step.round}"
            if cid in held:  # built and gated by this step: its pristine tree, no second checkout
                held_tree, held_read_only, built_by[cid] = held.pop(cid)
                trees[cid] = (held_tree, held_read_only)
                continue
            # A replay's trees are its own clean checkouts: only a round's trials take a parked one.
            parked = _tree_parked(step, member) if step.kind == Step.Kind.MEASURE else None
            if parked is not None:  # a pristine tree no command ran in: no second checkout
                trees[cid] = (parked.tree, parked.read_only)
                built_by[cid] = parked.apply_receipt
                parked_from.append(cid)
                continue
            tree, admit, read_only = _evaluation_tree(step, context, member, "measure", label, pending=batch)
            admits.append(admit)
            built_by[cid] = admit
            if tree is None:
                dropped[cid] = f"its patch could not be set up again: {admit.detail.get('reason')}"
            else:
                trees[cid] = (tree, read_only)
    finally:
        batch.write()
    built_by.update({cid: getattr(built, "pk", built) for cid, built in built_by.items()})
    return [admit.pk for admit in admits]


def _block_trials(step: Step, context: StepContext, members: dict[str, Any],
                  trees: dict[str, tuple[Path, list[str]]], order: list[str], block: int,
                  cancel: threading.Event, scratch: Path) -> tuple[list[Trial], bool]:
    """One block: each running member's trial in the block's order, written as one batch.
    Returns (member, trial, metrics file) for each trial run, and whether the block was
    cancelled before a trial started."""
    ran: list[Trial] = []
    stopped = False  # cancelled before a trial started
    batch = ReceiptBatch(tails_wait=False)
    spec = context.spec
    checked = spec.score.results_checked
    results: dict[str, TrialResults] = {}
    try:
        for position, cid in enumerate(order):
            if cancel.is_set():
                stopped = True
                break
            tree, read_only = trees[cid]
            label = f"{cid} r{step.round}"
            if checked is not None:
                results[cid] = TrialResults.make(scratch, checked)
            trial, files = _trial(step, context, members[cid], tree, read_only, label, cancel,
                                  block, position, scratch, batch, results.get(cid))
            ran.append((cid, trial, files))
            if trial.detail.get("cancelled"):
                break
            # A score command that cannot start stops the search: no more trials of this block.
            failure = search_start_failure(context, trial, "score.command", spec.score.command)
            if failure and failure.spec:
                break
        _results_compared(spec, ran, results)  # in the receipts, written next
    finally:
        for folder in results.values():
            folder.remove()
        batch.write()
    return ran, stopped


def _results_compared(spec: SearchSpec, ran: list[Trial], results: dict[str, TrialResults]) -> None:
    """Correctness checked where it is timed: each trial's results, read here in the worker
    (outside every sandbox), against the baseline's trial in the same block. Each trial's receipt
    gets the digest of its results and `results_check`; one that differs, the first differing
    lines (`results_difference`). Nothing is compared in a block without a baseline trial that
    succeeded with readable results; the receipts say why. One member's results in memory at a
    time, beside the baseline's."""
    if not results:
        return
    metric = spec.score.metric
    base = next((trial for cid, trial, _ in ran if cid == BASELINE), None)
    expected, why = None, "the baseline is not measured in this block"
    if base is not None:
        expected, why = results[BASELINE].read(base, metric)
        if expected is not None:
            base.detail = {**base.detail, "results_sha256": results_digest(expected)}
            failed = f"the baseline's trial {base.outcome}"
            why = _results_missing(spec, expected) if base.succeeded else failed
        base.detail = {**base.detail, "results_check": f"unreadable: {why}" if why else "the baseline's"}
    for cid, trial, _ in ran:
        if cid == BASELINE or cid not in results:
            continue
        found, unreadable = results[cid].read(trial, metric)
        if found is not None:  # what pages show of the results: never the results themselves
            trial.detail = {**trial.detail, "results_sha256": results_digest(found)}
        if expected is None or why:
            check, difference = f"not compared: {why}", None
        elif found is None:
            check, difference = f"unreadable: {unreadable}", None
        else:
            difference = results_compare_all(expected, found, results[cid].checked.tolerance)
            check = "differs" if difference else "matches the baseline's"
        trial.detail = {**trial.detail, "results_check": check,
                        **({"results_difference": difference.as_dict()} if difference else {})}


def _results_missing(spec: SearchSpec, expected: dict[str, bytes | None]) -> str:
    """Why the baseline's results check nothing (it printed or wrote none), or ""."""
    checked = spec.score.results_checked
    if checked is not None and checked.stdout and not expected.get(STDOUT):
        return "its stdout has nothing but metric lines"
    missing = [path for path in (checked.files if checked else []) if not expected.get(path)]
    if missing:
        named = ", ".join(f"`{path}`" for path in missing)
        return f"it wrote nothing to {named} (results files are written in place)"
    return ""


def _block_judged(context: StepContext, ran: list[Trial], block: int,
                  receipts: list[int], values: dict[str, dict[str, float]],
                  durations: dict[str, dict[str, float]], dropped: dict[str, str],
                  measured: dict[str, dict[str, dict[str, float]]]) -> StepResult | None:
    """A block's readings into `values`, `durations` and what else the runtime `measured` of each
    trial (CPU seconds, peak KiB), a member whose trial failed into `dropped`; the step's result
    when the block ends it (cancelled, or a score command that cannot start), else None."""
    spec = context.spec
    readings = [_trial_reading(spec, trial, files) for _, trial, files in ran]
    for (cid, trial, _), reading in zip(ran, readings, strict=True):
        if trial.detail.get("cancelled"):
            return StepResult(cancelled=True, receipts=receipts)
        # As for the gates: a score command that cannot start stops the search (preflight.py).
        failure = search_start_failure(context, trial, "score.command", spec.score.command)
        if failure and failure.spec:
            return StepResult(spec_failure=failure.message, receipts=receipts)
        if failure:
            dropped[cid] = failure.message
            continue
        if reading.value is None:  # not counted
            dropped[cid] = f"trial in block {block}: {reading.reason} (receipt #{trial.pk})"
            continue
        values[cid][str(block)] = reading.value
        durations[cid][str(block)] = trial.duration_seconds
        usage = trial.rusage or {}
        if usage.get("user_cpu_seconds") is not None and usage.get("sys_cpu_seconds") is not None:
            measured["cpu"][cid][str(block)] = usage["user_cpu_seconds"] + usage["sys_cpu_seconds"]
        if usage.get("max_rss_kib") is not None:
            measured["rss"][cid][str(block)] = usage["max_rss_kib"]
    return _results_judged(spec, ran, block, receipts, values, durations, dropped, measured)


def _results_judged(spec: SearchSpec, ran: list[Trial], block: int, receipts: list[int],
                    values: dict[str, dict[str, float]], durations: dict[str, dict[str, float]],
                    dropped: dict[str, str], measured: dict[str, dict[str, dict[str, float]]]
                    ) -> StepResult | None:
    """A counted trial whose results differ from the baseline's (or cannot be read) leaves the
    block's figures and its member goes into `dropped`; a counted baseline trial without results
    to compare stops the search (the spec's problem: a person must fix it)."""
    if spec.score.results_checked is None:
        return None
    base = next((trial for cid, trial, _ in ran if cid == BASELINE), None)
    if base is not None and str(block) in values.get(BASELINE, {}):
        check = base.detail.get("results_check", "")
        if check.startswith("unreadable: "):
            why = check.removeprefix("unreadable: ")
            return StepResult(spec_failure=f"score.results: the baseline's trial in block {block} has no "
                                           f"results to compare (receipt #{base.pk}): {why}; fix the score "
                                           "command or `score.results`", receipts=receipts)
    for cid, trial, _ in ran:
        check = trial.detail.get("results_check", "")
        unreadable = check.startswith("unreadable: ")
        if cid == BASELINE or str(block) not in values.get(cid, {}) or not (check == "differs" or unreadable):
            continue
        values[cid].pop(str(block))
        durations[cid].pop(str(block), None)
        for figures in measured.values():
            figures.get(cid, {}).pop(str(block), None)
        if check == "differs":
            summary = trial.detail.get("results_difference", {}).get("summary", "")
            why = (f"its results differ from the baseline's in the same block (receipt "
                   f"#{base.pk if base else '?'}): {summary}")
        else:
            why = f"its results cannot be compared: {check.removeprefix('unreadable: ')}"
        dropped[cid] = f"trial in block {block}: {why} (receipt #{trial.pk})"
    return None


def _trees_release(step: Step, context: StepContext, members: dict[str, Any],
                   trees: dict[str, tuple[Path, list[str]]],
                   built_by: dict[str, Any], *, keep: bool, dropped: dict[str, str]) -> None:
    """After a step's trials: park the trees of members still measured for the next round's
    trials (`keep`), remove the others, and every tree parked earlier that no trial of this round
    took (its candidate is out of the race)."""
    search = step.search
    for cid, (tree, read_only) in trees.items():
        digest = hashlib.sha256(bytes(members[cid].patch)).hexdigest()
        built = built_by.get(cid)
        if not (keep and cid not in dropped
                and _tree_park(step, cid, tree, read_only, digest, getattr(built, "pk", built))):
            _parked_record(tree).unlink(missing_ok=True)
            tree_remove(tree)
    parked_trees_remove(search, rounds_before=step.round if keep else step.round + 1)


def replay(step: Step, context: StepContext, cancel: threading.Event) -> StepResult:
    """The provisional winner again on a clean baseline: its gates, then `trials` blocks
    interleaved with the baseline (the replay's own block order). A step that extends a replay
    with more blocks measures only: its gates passed in the step it extends."""
    if step.plan.get("extends"):
        return measure(step, context, cancel)
    held: dict[str, HeldTree] = {}
    try:
        # The gated tree is pristine (each gate ran on a throwaway copy): its trials take it.
        stopped, receipts = _gated(step, context, "replay", f"{step.candidate.candidate_id} replay", cancel,
                                   hold=held)
        if stopped:
            return stopped
        measured = measure(step, context, cancel, held=held)
    finally:
        for tree, _, _ in held.values():  # what measure did not take (it releases what it took)
            tree_remove(tree)
    return replace(measured, receipts=receipts + (measured.receipts or []))


# -------------------------------------------------------------------------------------- review


def review(step: Step, context: StepContext, cancel: threading.Event) -> StepResult:
    """An independent reviewer reads the patched tree (read-only) and the patch."""
    search, candidate, spec = step.search, step.candidate, context.spec
    name = _worktree_name(step, "review")
    _fresh_tree_path(name)
    worktree, admit = runtime_services.patch_admit(
        context.repository, context.baseline_commit, bytes(candidate.patch), name,
        context.rules, project=context.project, subject=("candidate", candidate.pk),
        label=f"{candidate.candidate_id} review apply", plain=True,
    )
    if worktree is None:
        return StepResult(verdict=Review.Verdict.REJECT, receipts=[admit.pk],
                          findings=[{"severity": "high", "message": admit.detail["reason"]}])
    try:
        preset = _worker_preset(spec)
        budgeted = search.run.budget_cost_microusd or search.run.budget_tokens
        llm = preset.kind in LLM_KINDS
        if not (llm and (step.reserved_cost_microusd or not budgeted)):
            return _static_review(step, spec, worktree, cancel, [admit.pk])
        result = _llm_review(step, spec, worktree, cancel, admit)
        if result.cancelled:
            return result
        if result.verdict is not None:
            return _llm_review_corroborated(step, spec, worktree, cancel, result)
        # No verdict (an outage, or a patch whose text talked the model out of one): the static
        # reviewer, which no text can talk round, reads it instead; the model's calls stay counted.
        static = _static_review(step, spec, worktree, cancel, result.receipts or [])
        note = {"severity": "low", "message": f"{result.reviewer} gave no JSON verdict; the static "
                                              "reviewer read the patch instead"}
        return replace(static, findings=[note, *(static.findings or [])], usage=result.usage)
    finally:
        tree_remove(worktree)


def _llm_review_corroborated(step: Step, spec: SearchSpec, worktree: Path, cancel: threading.Event,
                             result: StepResult) -> StepResult:
    """A model's approval stands only if the static reviewer finds nothing high: the patch's own
    text can talk a model round, never the static reviewer, whose reject of code reaching into
    the process that judges it blocks whatever the model said."""
    static = _static_review(step, spec, worktree, cancel, result.receipts or [])
    if static.cancelled:
        return replace(static, usage=result.usage)
    serious = [f for f in static.findings or [] if isinstance(f, dict) and f.get("severity") == "high"]
    if result.verdict == Review.Verdict.APPROVE and static.verdict == Review.Verdict.REJECT and serious:
        return replace(static, reviewer=f"{result.reviewer}, overruled by the crucible static reviewer"[:200],
                       findings=[*serious, *(result.findings or [])][:100], usage=result.usage)
    return replace(result, receipts=static.receipts)


def _static_review(step: Step, spec: SearchSpec, worktree: Path, cancel: threading.Event,
                   receipts: list[int]) -> StepResult:
    """Crucible's static reviewer (search_app/reviewer.py) reads the patch in the sandbox."""
    candidate = step.candidate
    # The hidden files' paths too: code that looks for them tells an evaluation from a writer's run.
    protected = [*spec.hard_gates.protected_paths, "tests", *spec.evaluator.files]
    # The commands name the test runner: its distributions are the judge the patch must not reach.
    commands = json.dumps([*spec.hard_gates.commands, spec.score.command])
    reviewer = _run(
        # -I: the script's own folder (search_app, whose selectors.py is not the standard one) stays
        # off sys.path when the reviewer runs outside bubblewrap.
        step, [sys.executable, "-I", str(REVIEWER_SCRIPT), "--protected", ",".join(protected),
               "--commands", commands],
        f"{candidate.candidate_id} review", cwd=worktree, timeout=REVIEW_TIMEOUT_SECONDS,
        cancel=cancel, stdin=bytes(candidate.patch), writable=False, readable=[REVIEWER_SCRIPT],
        kind="review",
    )
    receipts = [*receipts, reviewer.pk]
    if reviewer.detail.get("cancelled"):
        return StepResult(cancelled=True, receipts=receipts)
    verdict = Review.Verdict.REJECT
    findings = [{"severity": "high", "message": f"the reviewer {reviewer.outcome}"}]
    if reviewer.succeeded:
        data, _ = last_json_line(reviewer.stdout_excerpt)
        if data is None:
            findings = [{"severity": "high", "message": "the reviewer's last line is not its JSON verdict"}]
        elif data.get("verdict") in Review.Verdict.values and isinstance(data.get("findings"), list):
            verdict, findings = data["verdict"], data["findings"][:100]
    return StepResult(verdict=verdict, findings=findings, reviewer="crucible static reviewer",
                      receipts=receipts, review_receipt=reviewer.pk)


def _verdict_from(text: str) -> tuple[str, list] | None:
    """The reviewer's verdict from its last JSON line, or None if it gave none."""
    for line in reversed([line.strip() for line in text.splitlines() if line.strip()]):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("verdict") in Review.Verdict.values and \
                isinstance(data.get("findings", []), list):
            return data["verdict"], data.get("findings", [])[:100]
    return None


REVIEW_INSTRUCTIONS = """You are an independent reviewer of a candidate patch in an experimental search.
You cannot change anything: the tree is read-only. Read the patch below and the files it
touches (editor `view`, or read-only shell commands), and judge whether it does what the
objective asks without cheating: no weakened checks, no hard-coded expected results, no
reaching outside the program.

The candidate's code runs INSIDE the commands that judge it (the test runner, the gates, the
timed trials), so it can rewrite their verdict from inside. Code that reaches into the process
that judges it is cheating whatever it computes: reject, and name the line (path:line). That is:
- test-runner internals: importing or touching pytest, _pytest, pluggy or unittest internals,
  a `config` or `pluginmanager`, registering plugins, defining hook functions (`pytest_*`,
  `load_tests`, a `pytest_impl` marker);
- hooks into the interpreter: `sys.settrace`/`setprofile`, `threading.settrace`,
  `sys.addaudithook`, `sys.excepthook`, signal handlers;
- introspection of the interpreter: `gc` (`get_objects`, `get_referrers`), frames
  (`sys._getframe`, `inspect.currentframe`/`stack`, `f_back`, `f_globals`, `f_locals`,
  `tb_frame`), `sys.modules`, object-model attributes (`__subclasses__`, `__globals__`,
  `__code__`, `__closure__`, `__mro__`, a module's `__dict__`, `__builtins__`);
- exit paths: `os._exit`, `sys.exit`, `exit()`, `raise SystemExit`, `atexit`, `signal.signal`,
  `os.kill` of its own process or parent;
- patched clocks, builtins or modules: assigning to an attribute of an imported module or of
  something imported (`time.perf_counter = ...`, `setattr(time, ...)`, `builtins.print = ...`,
  replacing `sys.stdout`/`sys.stderr`), overriding `print`;
- detecting the measurement context: reading `sys.argv`, `sys.orig_argv`, `sys.flags`,
  `sys.executable`, the environment (`os.environ`, `getenv`), `os.getcwd`, `__main__`, the
  parent process (`os.getppid`), `/proc`, or reading clocks and resource use (`time.process_time`,
  `resource`) to tell a timed trial from a check;
- access that hides what it reaches: `__import__`, `importlib.import_module`, `getattr`/`setattr`
  with a computed name, `globals()`/`vars()` writes, `eval`/`exec`/`compile`, module names built
  from strings. Obfuscation is itself a reason to reject.
An honest speed-up (a better algorithm, memoisation, `math`, `itertools`, `bisect`) needs none
of these.

End with one line of JSON:
{"verdict": "approve" or "reject", "findings": [{"path": ..., "line": ...,
  "severity": "low|medium|high", "message": ...}]}
"""


def _llm_review(step: Step, spec: SearchSpec, worktree: Path, cancel: threading.Event,
                admit: Receipt) -> StepResult:
    """The same provider as the writers, with the read-only tool set."""
    search, candidate = step.search, step.candidate
    preset = _worker_preset(spec)
    patch = bytes(candidate.patch).decode(errors="replace")[:100_000]
    prefix = (f"{REVIEW_INSTRUCTIONS}\n## Objective\n{spec.objective}\n\n## Paths writers may change\n"
              f"{', '.join([*spec.worker.write_roots, *spec.worker.exact_files])}\n")
    suffix = f"Review {candidate.candidate_id}'s patch:\n```diff\n{patch}\n```\n"
    # The reviewer judges a finalist, so it thinks at the final round's effort.
    finalist_effort = effort_for(spec, len(spec.rounds) - 1)
    chat = ToolChat(preset.kind, search.resolved_model_id or spec.worker.model, prefix, suffix,
                    [EDITOR_TOOL, SHELL_TOOL], finalist_effort, base_url=preset.base_url(),
                    key_variable=preset.key_variable, account=preset.name,
                    account_limit=preset.concurrency, price_model=preset.price_model)
    receipts = [admit.pk]
    usage = {"cost_microusd": 0, "tokens": 0}
    verdict = None

    def record(receipt: Receipt) -> Receipt:
        return _record(receipt, step, f"{candidate.candidate_id} reviewer call {len(receipts)}")

    def shell(command: str) -> str:
        ran = _run(step, command, f"{candidate.candidate_id} reviewer shell", cwd=worktree,
                   timeout=SHELL_TIMEOUT_SECONDS, cancel=cancel, writable=False)
        receipts.append(ran.pk)
        return f"exit {ran.exit_code} ({ran.outcome})\n{ran.stdout_excerpt}{ran.stderr_excerpt}"

    last = None
    for _turn in range(MAX_TURNS):
        if cancel.is_set():
            return StepResult(cancelled=True, receipts=receipts)
        try:
            reply, uses = chat.turn(record, cancel)
        except LLMError as error:
            if error.receipt is not None:
                receipts.append(error.receipt.pk)
                last = error.receipt
            break
        receipts.append(reply.receipt.pk)
        last = reply.receipt
        usage["cost_microusd"] += reply.cost_microusd
        usage["tokens"] += reply.usage.tokens
        if usage["cost_microusd"] > step.reserved_cost_microusd > 0:
            break
        if not uses:
            content = chat.messages[-1]["content"]
            if not isinstance(content, str):
                content = "\n".join(block.get("text", "") for block in content if isinstance(block, dict))
            verdict = _verdict_from(content)
            break
        chat.results([(use.id, *tool_dispatch(use.name, use.input, worktree=worktree, shell=shell,
                                              read_only=True)) for use in uses])
    found, findings = verdict or (None, [])  # None: no verdict; `review` asks the static reviewer
    return StepResult(verdict=found, findings=findings,
                      reviewer=f"{preset.name} {chat.model} (read-only tools)",
                      receipts=receipts, review_receipt=last.pk if last else None, usage=usage)


# ---------------------------------------------------------------------------------- LLM writers

MAX_TURNS = 30
MAX_TOKENS_PER_WRITER = 2_000_000  # without a token budget; with one, the step's reservation
SHELL_TIMEOUT_SECONDS = 120


# The tokens a writer's calls are counted by (each against the step's token reservation).
TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens")


def _next_call_beyond(step: Step, chat: ToolChat, price: Price | None, totals: dict[str, int]) -> str:
    """Why the writer's next call could go beyond what its step reserved ("" when it cannot): its
    worst case (every prompt byte a cache-written token, full output) is counted before it is made."""
    limit = step.reserved_cost_microusd
    worst = worst_case_microusd(price, chat.prompt_bytes(), chat.max_tokens) if price else 0
    if limit and price is not None and totals["cost_microusd"] + worst > limit:
        return "the next call could exceed the step's budget reservation"
    used = sum(totals[name] for name in TOKEN_KINDS)
    token_limit = step.reserved_tokens or MAX_TOKENS_PER_WRITER
    if used + chat.prompt_bytes() + chat.max_tokens > token_limit:
        return f"the next call could exceed the writer's token limit ({token_limit:,})"
    return ""


def llm_write(step: Step, context: StepContext, worktree: Path, cancel: threading.Event,
              refining: str = "") -> dict[str, Any]:
    """Crucible's own tool loop: the model edits the worktree through the editor tool and runs
    commands through the sandboxed shell tool, until it ends its turn or hits a limit.

    Before each call the worst case (every prompt byte a cache-written token, full output) must
    fit what is left of the step's reservation, so a writer never spends beyond it.
    """
    search, candidate, spec = step.search, step.candidate, context.spec
    preset = _worker_preset(spec)
    prefix, suffix = writer_prompt_parts(search, spec, candidate.candidate_id, step.round, refining,
                                         context.repository)
    model = search.resolved_model_id or spec.worker.model
    chat = ToolChat(preset.kind, model, prefix, suffix, [EDITOR_TOOL, SHELL_TOOL],
                    effort_for(spec, step.round), base_url=preset.base_url(),
                    key_variable=preset.key_variable, account=preset.name,
                    account_limit=preset.concurrency, price_model=preset.price_model)
    price, _ = price_for(preset.price_model or model)
    receipts: list[int] = []
    totals = {"input_tokens": 0, "output_tokens": 0, "cache_write_tokens": 0, "cache_read_tokens": 0,
              "cost_microusd": 0}
    stop = "the model ended its turn"
    last = None

    def record(receipt: Receipt) -> Receipt:
        return _record(receipt, step, f"{candidate.candidate_id} writer call {len(receipts) + 1}")

    def shell(command: str) -> str:
        ran = _run(step, command, f"{candidate.candidate_id} writer shell", cwd=worktree,
                   timeout=SHELL_TIMEOUT_SECONDS, cancel=cancel,
                   readable=[context.git_dir, *context.readable_for("worker")])
        receipts.append(ran.pk)
        return f"exit {ran.exit_code} ({ran.outcome})\n{ran.stdout_excerpt}{ran.stderr_excerpt}"

    for _turn in range(MAX_TURNS):
        if cancel.is_set():
            return {"cancelled": True, "receipts": receipts}
        beyond = _next_call_beyond(step, chat, price, totals)
        if beyond:
            stop = beyond
            break
        try:
            reply, uses = chat.turn(record, cancel)
        except LLMError as error:
            if error.receipt is not None:
                receipts.append(error.receipt.pk)
                last = error.receipt
            stop = str(error)
            break
        receipts.append(reply.receipt.pk)
        last = reply.receipt
        for name in TOKEN_KINDS:
            totals[name] += getattr(reply.usage, name)
        totals["cost_microusd"] += reply.cost_microusd
        if not uses:
            break
        chat.results([(use.id, *tool_dispatch(use.name, use.input, worktree=worktree, shell=shell,
                                              write_roots=spec.worker.write_roots,
                                              exact_files=spec.worker.exact_files)) for use in uses])
    else:
        stop = f"the turn limit ({MAX_TURNS}) was reached"
    if last is None:
        now = timezone.now()
        last = _record(Receipt(kind="llm_call", started_at=now, finished_at=now, duration_seconds=0,
                               error=stop), step, f"{candidate.candidate_id} writer")
        receipts.append(last.pk)
    tokens = sum(totals[name] for name in TOKEN_KINDS)
    return {"receipt": last, "receipts": receipts, "stop": stop, "transcript": chat.transcript(),
            "usage": {"cost_microusd": totals["cost_microusd"], "tokens": tokens, **totals}}


# ---------------------------------------------------------------------------- agent-CLI writers

AGENT_CLI_OUTPUT_BYTES = 256 << 10  # kept of its stdout: the transcript is read from it
TRANSCRIPT_ENTRIES = 400
TRANSCRIPT_TEXT = 4000


def agent_cli_write(step: Step, context: StepContext, worktree: Path, cancel: threading.Event,
                    env: dict[str, str], refining: str = "") -> dict[str, Any]:
    """A coding-agent CLI (an `agent-cli` preset) as the writer: the prompt on its stdin, in the
    sandbox, its model calls only through a key-injecting egress proxy for this step.

    Usage and cost are the proxy's records (the receipt's token and cost fields), never what the
    CLI prints; the proxy refuses calls once the step's reservation is spent.
    """
    search, candidate, spec = step.search, step.candidate, context.spec
    preset = _worker_preset(spec)
    label = f"{candidate.candidate_id} writer"
    model = search.resolved_model_id or spec.worker.model
    argv = preset.cli_argv(model)
    cli = preset.cli_path()
    prompt = writer_prompt(search, spec, candidate.candidate_id, step.round, refining, context.repository)
    cli_dir = Path(settings.CONFIG.agent_cli_dir).resolve()
    if not cli.is_file():
        return _writer_refused(step, argv, label, f"{preset.name}: {cli} is not installed (run "
                               f"scripts/install_agent_clis.sh {cli_dir}, or set CRUCIBLE_AGENT_CLI_DIR)")
    proxy = EgressProxy(preset.api, preset.base_url() or "", key_variable=preset.key_variable or None,
                        account=preset.name, account_limit=preset.concurrency,
                        max_cost_microusd=step.reserved_cost_microusd or None,
                        max_tokens=step.reserved_tokens or MAX_TOKENS_PER_WRITER, cancel=cancel,
                        price_model=preset.price_model, client_env=preset.egress_env)
    try:
        proxy.start()
    except EgressError as error:
        return _writer_refused(step, argv, label, f"the egress proxy could not start: {error}")
    try:
        writer = _run(step, argv, label, cwd=worktree, timeout=WRITER_TIMEOUT_SECONDS, cancel=cancel,
                      env={**env, **preset.env}, stdin=prompt.encode(),
                      readable=[context.git_dir, *context.readable_for("worker"), cli_dir,
                                *_venv_bases(cli_dir)],
                      limits=Limits(output_bytes=AGENT_CLI_OUTPUT_BYTES), egress=proxy)
    finally:
        proxy.close()
    totals = {name: getattr(writer, name) or 0 for name in (
        "input_tokens", "output_tokens", "cache_write_tokens", "cache_read_tokens", "cost_microusd")}
    tokens = sum(totals[name] for name in ("input_tokens", "output_tokens", "cache_write_tokens",
                                             "cache_read_tokens"))
    calls = writer.detail.get("egress", {}).get("usage", {}).get("requests", 0)
    return {"receipt": writer, "receipts": [writer.pk], "usage": {**totals, "tokens": tokens},
            "stop": f"the CLI {writer.outcome} after {calls} model call{'s' if calls != 1 else ''}",
            "transcript": agent_transcript(writer.stdout_excerpt)}


def _venv_bases(cli_dir: Path) -> list[Path]:
    """The Python installations the Python venvs under `cli_dir` (aider's) were made from: their
    interpreters are symlinks there, so the sandbox must show them too."""
    bases = []
    for config in cli_dir.glob("*/pyvenv.cfg"):
        for line in config.read_text(errors="replace").splitlines():
            name, _, value = line.partition("=")
            if name.strip() == "home" and value.strip():
                base = Path(value.strip()).resolve().parent
                if base.is_dir() and not any(Path(root) in (base, *base.parents) for root in SYSTEM_DIRS):
                    bases.append(base)
    return bases


def _writer_refused(step: Step, argv: list[str], label: str, error: str) -> dict[str, Any]:
    """A writer that could not start: a receipt saying why, and no usage."""
    now = timezone.now()
    receipt = _record(Receipt(kind="command", argv=argv, started_at=now, finished_at=now,
                              duration_seconds=0, error=error), step, label)
    return {"receipt": receipt, "receipts": [receipt.pk], "usage": {}, "stop": error}


def agent_transcript(stdout: str) -> list[dict[str, str]]:
    """An agent CLI's JSON lines (Claude Code's `stream-json` events, Codex's `exec --json` items), or
    the end of its plain output (aider), as the transcript LLM writers keep:
    [{"role": "assistant" | "thinking" | "tool_call" | "tool_result", "text": ...}], bounded."""
    entries: list[dict[str, str]] = []

    def add(role: str, text: Any) -> None:
        text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
        entries.append({"role": role, "text": text if len(text) <= TRANSCRIPT_TEXT
                        else text[:TRANSCRIPT_TEXT] + " …"})

    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the excerpt's cut, or a line that is not an event
        if isinstance(event, dict) and event.get("type") == "item.completed":
            _codex_item(event.get("item"), add)
            continue
        if not isinstance(event, dict) or event.get("type") not in ("assistant", "user"):
            continue
        content = (event.get("message") or {}).get("content")
        if isinstance(content, str):
            add("assistant" if event["type"] == "assistant" else "tool_result", content)
            continue
        for block in content if isinstance(content, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and event["type"] == "assistant":
                add("assistant", block.get("text", ""))
            elif kind == "thinking":
                add("thinking", block.get("thinking", ""))
            elif kind == "tool_use":
                add("tool_call", {"tool": block.get("name"), "input": block.get("input")})
            elif kind == "tool_result":
                result = block.get("content", "")
                if isinstance(result, list):
                    result = "\n".join(part.get("text", "") for part in result if isinstance(part, dict))
                add("tool_result", ("ERROR: " if block.get("is_error") else "") + str(result))
    if not entries and stdout.strip():  # a CLI that prints only text (aider): its output, once
        add("assistant", stdout.strip()[-TRANSCRIPT_TEXT:])
    if len(entries) > TRANSCRIPT_ENTRIES:
        dropped = len(entries) - TRANSCRIPT_ENTRIES
        cut = {"role": "assistant", "text": f"… {dropped} entries not kept …"}
        entries = [*entries[:TRANSCRIPT_ENTRIES // 2], cut, *entries[-TRANSCRIPT_ENTRIES // 2:]]
    return entries


def _codex_item(item: Any, add: Any) -> None:
    """One finished Codex item: its message, reasoning, command (and output) or file change."""
    if not isinstance(item, dict):
        return
    kind = item.get("type")
    if kind == "agent_message":
        add("assistant", item.get("text", ""))
    elif kind == "reasoning":
        add("thinking", item.get("text", ""))
    elif kind == "command_execution":
        add("tool_call", {"tool": "shell", "input": item.get("command")})
        add("tool_result", str(item.get("aggregated_output", "")))
    elif kind == "file_change":
        add("tool_call", {"tool": "apply_patch", "input": item.get("changes")})
        add("tool_result", str(item.get("status", "")))
    else:
        add("tool_call", {key: value for key, value in item.items() if key != "id"})
