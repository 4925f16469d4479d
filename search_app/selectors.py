"""Reads for search_app, filtered by project access."""

from __future__ import annotations

import hashlib
import shlex
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.core.exceptions import PermissionDenied
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    F,
    FloatField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.http import Http404
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runtime_app import access
from runtime_app.clock import clock_text
from runtime_app.fleet import preset_get, preset_resolve_model
from runtime_app.git import GitError
from runtime_app.metrics import metric_source
from runtime_app.models import AuditEntry, ProjectMembership, Receipt
from runtime_app.presenters import short_sha
from runtime_app.prices import price_for
from runtime_app.selectors import projects_for_user, receipts_for_user
from runtime_app.subjects import Attention, ProjectSection
from runtime_app.worktrees import git_run, object_scratch, patch_from_text, patched_tree
from search_app.diffs import (
    diff_line_texts,
    diff_lines,
    line_ranges_text,  # noqa: F401 (services reads it here; its home is diffs)
)
from search_app.execution import search_spec
from search_app.figures import candidate_figures, search_metric
from search_app.figures import versus as figures_versus
from search_app.forecast import Forecast, History, RunPosition, StepSample, TimeLeft, forecast, time_left
from search_app.measurement import figure_text, is_paired
from search_app.models import Approval, Candidate, Comment, Merge, Search, SearchRun, Spec, SpecVersion, Step
from search_app.plotting import ScorePoint
from search_app.spec import SearchSpec, spec_warnings
from search_app.status import candidate_statuses, search_status_of

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
    from django.db.models import OrderBy
    from django_stubs_ext import WithAnnotations

    # Whoever a request is from: a signed-in person, or nobody (every read then finds nothing).
    User = AbstractBaseUser | AnonymousUser


def specs_for_user(user: User) -> QuerySet[Spec]:
    return Spec.objects.select_related("project").filter(project__in=projects_for_user(user))


def spec_list_for_user(user: User) -> QuerySet[Spec]:
    """Specs with their number of versions and the latest version's number and validity."""
    latest = SpecVersion.objects.filter(spec=OuterRef("pk")).order_by("-number")
    return specs_for_user(user).select_related("created_by").annotate(
        version_count=Count("versions"),
        latest_number=Subquery(latest.values("number")[:1]),
        latest_valid=Subquery(latest.values("valid")[:1]),
    )


def spec_for_user(user: User, spec_id: int) -> Spec:
    spec = specs_for_user(user).filter(pk=spec_id).first()
    if spec is None:
        raise Http404("No such spec.")
    return spec


def spec_version_get(spec: Spec, number: int) -> SpecVersion:
    version = spec.versions.filter(number=number).first()
    if version is None:
        raise Http404(f"{spec.title} has no version {number}.")
    return version


def searches_for_user(user: User) -> QuerySet[Search]:
    return Search.objects.select_related("project", "created_by").filter(
        project__in=projects_for_user(user)
    )


def search_for_user(user: User, search_id: str) -> Search:
    search = searches_for_user(user).filter(search_id=search_id).first()
    if search is None:
        raise Http404("No such search.")
    return search


def winner_standing(approval: dict[str, Any], merged: bool) -> str:
    """Where a winner stands with people, in the words every page, the API and the CLI use:
    awaiting approval, changes requested, approved (enough approvals to merge), or merged."""
    if merged:
        return "merged"
    if approval["changes_requested"]:
        return "changes requested"
    return "approved" if approval["mergeable"] else "awaiting approval"


def run_summary(search: Search) -> dict[str, Any]:
    """The run's state, budget, model-call totals, review and merge, without the candidate list:
    a fixed number of queries whatever the population."""
    run = SearchRun.objects.filter(search=search).select_related("winner").first()  # never a stale cache
    counts = dict(Candidate.objects.filter(search=search, number__gt=0).values_list("state")
                  .annotate(n=Count("pk")).values_list("state", "n"))
    review = search.reviews.select_related("candidate").order_by("-id").first()
    calls = Receipt.objects.filter(subject_type="candidate", kind="llm_call", subject_id__in=Candidate.objects
                                   .filter(search=search).values("pk")).aggregate(
        calls=Count("id"), input=Sum("input_tokens"), read=Sum("cache_read_tokens"),
        write=Sum("cache_write_tokens"), output=Sum("output_tokens"), cost=Sum("cost_microusd"))
    prompt_tokens = (calls["input"] or 0) + (calls["read"] or 0) + (calls["write"] or 0)
    merge = Merge.objects.filter(search=search).first()
    budget = {
        "max_cost_microusd": run.budget_cost_microusd if run else None,
        "max_tokens": run.budget_tokens if run else None,
        "spent_cost_microusd": run.spent_cost_microusd if run else 0,
        "spent_tokens": run.spent_tokens if run else 0,
        "reserved_cost_microusd": run.reserved_cost_microusd if run else 0,
        "reserved_tokens": run.reserved_tokens if run else 0,
    }
    return {
        "search_id": search.search_id,
        "name": search.name,
        "status": run.status if run else "not started",
        "phase": run.phase if run else "",
        "round": run.round_index if run else None,
        "outcome": run.outcome if run else "",
        "winner": run.winner.candidate_id if run and run.winner else None,
        "winner_patch_sha256": run.winner.patch_sha256 if run and run.winner else None,
        "reason": run.reason if run else "",
        # A command of the spec that could not start and stopped the search (search_app/preflight.py).
        "spec_failure": (search.steps.filter(result__has_key="spec_failure").order_by("finished_at", "id")
                         .values_list("result__spec_failure", flat=True).first() or "") if run else "",
        "started_at": run.started_at if run else None,
        "finished_at": run.finished_at if run else None,
        "budget": budget,
        "states": counts,
        "llm": {
            "calls": calls["calls"], "input_tokens": calls["input"] or 0,
            "output_tokens": calls["output"] or 0,
            "cache_read_tokens": calls["read"] or 0, "cache_write_tokens": calls["write"] or 0,
            "cost_microusd": calls["cost"] or 0,
            # The share of prompt tokens read from the provider's cache (None before any call).
            "cache_hit_ratio": round((calls["read"] or 0) / prompt_tokens, 4) if prompt_tokens else None,
        },
        "review": {"candidate": review.candidate.candidate_id, "verdict": review.verdict,
                   "findings": review.findings, "reviewer": review.reviewer} if review else None,
        "merge": {"branch": merge.branch, "commit": merge.commit_sha, "by": merge.merged_by_name,
                  "at": merge.created_at} if merge else None,
        "winner_status": winner_standing(approval_state(run.winner), merge is not None)
        if run and run.outcome == "winner" and run.winner else None,
        # The one status every page, the API and the CLI show (search_app/status.py).
        "status_info": search_status_of(search).as_dict(),
        **run_timing(search, run),
    }


# Steps that will not run again.
STEP_ENDED = (Step.State.DONE, Step.State.FAILED, Step.State.CANCELLED)
# Candidates not out of the search: still to write, being written or evaluated, or alive.
_IN_PLAY = (Candidate.State.QUEUED, Candidate.State.WRITING, Candidate.State.EVALUATING,
            Candidate.State.ALIVE)


def run_timing(search: Search, run: Any, now: Any = None) -> dict[str, Any]:
    """How long the run has taken (or took) and, while it runs, how long it has left: the work its
    plan still implies, timed by this search's own finished steps (search_app/forecast.py,
    `time_left`), as a range that narrows as steps finish, with the spec's timeouts as the worst
    case. `time_left` is None once the run ended."""
    if run is None or run.started_at is None:
        return {"elapsed_seconds": None, "elapsed_text": "", "eta_seconds": None, "eta_text": "",
                "time_left": None}
    end = run.finished_at if run.terminal and run.finished_at else (now or timezone.now())
    elapsed = max(0.0, (end - run.started_at).total_seconds())
    left = None
    if run.status == SearchRun.Status.RUNNING and run.phase != SearchRun.Phase.REVISE:
        left = search_time_left(search, run, end)
    return {"elapsed_seconds": round(elapsed), "elapsed_text": clock_text(elapsed),
            "eta_seconds": round(left.mid) if left is not None and not left.untimed else None,
            "eta_text": left.text if left is not None else "",
            "time_left": left.as_dict() if left is not None else None}


def _planned_trials(plan: dict[str, Any] | None) -> int:
    """A measure or replay step's trial runs: its members × its blocks."""
    members, blocks = (plan or {}).get("members") or [], (plan or {}).get("blocks") or [0, 0]
    return len(members) * max(blocks[1] - blocks[0], 0) if len(blocks) == 2 else 0


def search_time_left(search: Search, run: Any, now: Any) -> TimeLeft:
    """The forecast's inputs, read in a few queries: the steps (kind, round, state, wall seconds,
    planned trial runs, and a running measurement's trial runs so far) and the candidates still in
    play."""
    samples = []
    for kind, round_index, state, started, finished, plan in search.steps.values_list(
            "kind", "round", "state", "started_at", "finished_at", "plan"):
        stop = finished if state in STEP_ENDED else (now if state == Step.State.RUNNING else None)
        seconds = (stop - started).total_seconds() if started and stop else None
        trials = _planned_trials(plan)
        done = 0
        if state == Step.State.RUNNING and kind in (Step.Kind.MEASURE, Step.Kind.REPLAY) and started:
            # Its trial runs so far: each leaves a receipt ("cand_007 trial block 3").
            done = Receipt.objects.filter(
                subject_type="candidate", subject_id__in=search.candidates.values("pk"),
                label__contains=" trial block ", started_at__gte=started).count()
        samples.append(StepSample(kind=kind, round=round_index, state=state,
                                  seconds=max(seconds, 0.0) if seconds is not None else None, trials=trials,
                                  started=(started - run.started_at).total_seconds() if started else None,
                                  trials_done=min(done, trials)))
    in_play = search.candidates.filter(number__gt=0, state__in=_IN_PLAY)
    states = Counter(in_play.values_list("state", flat=True))
    baseline_alive = search.candidates.filter(number=0, state__in=_IN_PLAY).exists()
    position = RunPosition(phase=run.phase, round_index=run.round_index,
                           queued=states[Candidate.State.QUEUED], survivors=sum(states.values()),
                           baseline_alive=baseline_alive)
    return time_left(search_spec(search), position, samples)


def search_run_report(search: Search) -> dict[str, Any]:
    """The run summary plus every candidate with its fate and receipts (JSON-ready: API and CLI),
    with the metric and who measured it at the top and on every candidate."""
    report = run_summary(search)
    metric = search.spec_normalized["score"]["metric"]
    reported = search.spec_normalized["score"].get("reported")
    report.update(metric=metric, metric_source=metric_source(metric, reported))
    # The metric's unit and direction, as every figure below is shown in (search_app/figures.py).
    report["metric_unit"] = search_metric(search).as_dict()
    report["warnings"] = spec_warnings(search_spec(search))  # "nothing checks correctness …"
    report.pop("started_at"), report.pop("finished_at"), report.pop("winner_patch_sha256")
    if report["merge"]:
        report["merge"]["at"] = report["merge"]["at"].isoformat()
    candidates = list(search.candidates.order_by("number").defer("patch"))
    receipts: dict[int, list[int]] = {}
    for candidate_pk, receipt_pk in Receipt.objects.filter(
        subject_type="candidate", subject_id__in=[c.pk for c in candidates]
    ).values_list("subject_id", "pk"):
        receipts.setdefault(candidate_pk, []).append(receipt_pk)
    paired = search_paired(search)
    statuses = candidate_statuses(search, candidates)
    report["candidates"] = [
        {
            "candidate_id": c.candidate_id, "state": c.state, "round_reached": c.round_reached,
            "gates_passed": c.gates_passed, "score": c.score, "spread": c.spread, "trials": c.trials,
            # As the pages show it: a paired ratio with its interval, or the plain median.
            "figure": figure_text(c.score, c.score_low, c.score_high, paired=paired) if c.score is not None
            else "", "score_low": c.score_low, "score_high": c.score_high, "score_absolute": c.score_absolute,
            "cost_microusd": c.cost_microusd, "tokens": c.tokens, "diff_lines": c.diff_lines,
            "patch_sha256": c.patch_sha256, "patch_round": c.patch_round, "reason": c.reason,
            "receipts": receipts.get(c.pk, []), "metric_source": report["metric_source"],
            # The same figures in words and units: "122× faster (113–126×)", "21.6 ms", per round's trials.
            "figures": candidate_figures(c, search),
            "status_info": statuses[c.pk].as_dict(),
        }
        for c in candidates
    ]
    report["best"] = best_versus(search, candidates)
    shown = ("round", "planned", "entered", "went_on", "fell", "cancelled", "state", "text")
    report["rounds"] = [{key: step[key] for key in shown} for step in search_funnel(search)["rounds"]]
    return report


def best_versus(search: Search, candidates: list[Any]) -> dict[str, Any] | None:
    """The best scored candidate (the winner once there is one) against the baseline, as the
    searches list says it: "122× faster (113–126×) · 21.6 ms vs 2.64 s", with its parts."""
    metric = search_metric(search)
    scored = [c for c in candidates if c.number and c.score is not None]
    baseline = next((c for c in candidates if not c.number), None)
    if not scored:
        return None
    winner = next((c for c in scored if c.state == Candidate.State.WINNER), None)
    best = winner or (min if metric.direction == "minimize" else max)(scored, key=lambda c: c.score)
    paired = best.score_absolute is not None and best.score != best.score_absolute
    value = best.score_absolute if best.score_absolute is not None else best.score
    base = None
    if baseline is not None:
        base = baseline.score_absolute if baseline.score_absolute is not None else baseline.score
    line = figures_versus(value, base, metric, ratio=best.score if paired else None,
                          low=best.score_low if paired else None, high=best.score_high if paired else None,
                          spread=best.spread,
                          baseline_spread=baseline.spread if baseline is not None else None)
    return {"candidate_id": best.candidate_id, **(line or {})}


def search_receipts(user: User, search: Search) -> QuerySet:
    candidate_ids = list(search.candidates.values_list("pk", flat=True))
    return receipts_for_user(user).filter(subject_type="candidate", subject_id__in=candidate_ids)


def step_search_pk(step_pk: int) -> int | None:
    return Step.objects.filter(pk=step_pk).values_list("search_id", flat=True).first()


# ---- candidates, review and approval


def candidate_for_user(user: User, search_id: str, candidate_id: str) -> Any:
    """A candidate of a search the user can see (404 otherwise, the same for outsiders)."""
    candidate = Candidate.objects.select_related(
        "search__project", "search__created_by", "duplicate_of"
    ).filter(
        search__in=searches_for_user(user), search__search_id=search_id, candidate_id=candidate_id
    ).first()
    if candidate is None:
        raise Http404("No such candidate.")
    return candidate


def winner_replay(search: Search) -> dict[str, Any] | None:
    """The passed replay of the search's winner: why it passed and its receipts."""
    run = SearchRun.objects.filter(search=search).first()
    if run is None or run.winner_id is None:
        return None
    step = Step.objects.filter(search=search, candidate_id=run.winner_id, kind=Step.Kind.REPLAY,
                               state=Step.State.DONE, result__passed=True).order_by("-id").first()
    if step is None:
        return None
    # A replay that needed more blocks ran as several steps: all their receipts are its evidence.
    steps = Step.objects.filter(search=search, candidate_id=run.winner_id, kind=Step.Kind.REPLAY,
                                state=Step.State.DONE, plan__namespace=step.plan.get("namespace")
                                ).order_by("id")
    receipts = [pk for each in steps for pk in (each.result or {}).get("receipts", [])]
    return {"why": step.result.get("why", ""), "receipts": receipts, "score": step.result.get("score")}


def approval_state(candidate: Any) -> dict[str, Any]:
    """Each person's standing decision on the candidate, which of them count, and whether the
    winner may be merged (enough current approvals by approvers, no current request for changes).

    A decision counts only while it is on the current patch, not withdrawn, and its maker is
    still an active member of the project with the approve permission: checked here, on every
    read, so a departure no hook saw cannot leave a decision counting.
    """
    history = list(candidate.approvals.order_by("created_at", "id"))
    decisions: dict[int | None, Any] = {}
    for approval in history:
        approval.candidate = candidate  # `stale` compares with this candidate's current hash
        decisions[approval.user_id] = approval
    for approval in history:  # the page marks the decisions a later one of the same person replaced
        approval.replaced = decisions[approval.user_id] is not approval
    makers = [pk for pk in decisions if pk is not None]
    approvers = set(ProjectMembership.objects.filter(
        project_id=candidate.search.project_id, user_id__in=makers,
        role__in=[role for role in access.ROLE_NAMES if access.role_allows(role, access.APPROVER)])
        .values_list("user_id", flat=True))
    deciders = {user.pk for user in get_user_model().objects.filter(pk__in=makers, is_active=True)
                if user.is_superuser or user.pk in approvers}

    def counts(approval: Any) -> bool:
        return not approval.stale and approval.withdrawn_at is None and approval.user_id in deciders

    standing = [a for a in decisions.values() if a.decision == Approval.Decision.APPROVE and counts(a)]
    changes = [a for a in decisions.values() if a.decision == Approval.Decision.REQUEST_CHANGES and counts(a)]
    required = settings.CONFIG.required_approvals
    blocker = ""
    if changes:
        blocker = f"{', '.join(a.user_name for a in changes)} requested changes."
    elif len(standing) < required:
        blocker = f"It needs {required} approval{'s' if required != 1 else ''} on the current patch; " \
                  f"it has {len(standing)}."
    return {"history": history, "decisions": decisions, "standing_approvals": standing,
            "changes_requested": changes, "required": required, "mergeable": not blocker,
            "blocker": blocker, "stale": [a for a in history if a.stale],
            "withdrawn": [a for a in history if a.withdrawn_at is not None]}


def decision_refusals(user: User, search: Search) -> dict[str, str]:
    """Why `user` may not approve, or request changes to, `search`'s winner now: one sentence per
    decision, empty when they may. The pages show it beside a disabled button before anyone
    clicks, and services.approval_record refuses with it, so the two cannot disagree."""
    try:
        access.require(user, access.APPROVER, search.project)
    except PermissionDenied as refused:
        return {"approve": str(refused), "request_changes": str(refused)}
    if Merge.objects.filter(search=search).exists():
        merged = "This winner is merged already."
        return {"approve": merged, "request_changes": merged}
    if SearchRun.objects.filter(search=search, phase="revise").exists():
        return {"approve": REVISING, "request_changes": REVISING}
    approve = ""
    if not settings.CONFIG.self_approval and search.created_by_id == user.pk:
        approve = ("You froze this search, so someone else must approve its winner (an administrator "
                   "can allow it with CRUCIBLE_SELF_APPROVAL=true).")
    return {"approve": approve, "request_changes": ""}


REVISING = ("Its writer is revising the patch, as changes were requested: decide on the revised "
            "patch once the revision is in.")
MAX_REVISIONS = 3  # per search: each one runs a writer, the gates, blocks and a review again


def revisions_of(search: Search) -> list[Any]:
    """The revision requests of the search's winner, oldest first: each is the writer step that
    answered it (its plan holds the request)."""
    return list(search.steps.filter(kind=Step.Kind.GENERATE, plan__revision__isnull=False).order_by("id"))


def revision_refusal(user: User, search: Search) -> str:
    """Why `user` may not send the winner back to its writer now, or "" when they may: the page
    shows it beside a disabled button, and services.search_revise refuses with it."""
    try:
        access.require(user, access.OPERATOR, search.project)
    except PermissionDenied as refused:
        return str(refused)
    run = SearchRun.objects.filter(search=search).select_related("winner").first()
    if run is not None and run.phase == "revise":
        return "Its writer is revising the patch already."
    if (run is None or run.status != SearchRun.Status.FINISHED or run.outcome != "winner"
            or run.winner is None):
        return "Only a finished search's winner can be sent back to its writer."
    if Merge.objects.filter(search=search).exists():
        return "This winner is merged already."
    if not approval_state(run.winner)["changes_requested"]:
        return ("Nobody has requested changes to the current patch: an approver requests changes "
                "first, and the writer answers them.")
    if len(revisions_of(search)) >= MAX_REVISIONS:
        return f"Its writer has revised it {MAX_REVISIONS} times, the most a search allows."
    return ""


def revision_feedback(candidate: Any, note: str = "") -> str:
    """What the writer is told to answer: the standing requests for changes (with their notes),
    the open threads on its patch (with their replies) and the note of whoever sent it back. Plain
    text: the writer reads it as part of its prompt."""
    lines = ["Reviewers requested changes to your patch. Revise it to answer them; keep what they did "
             "not ask you to change."]
    for approval in approval_state(candidate)["changes_requested"]:
        said = f": {approval.note}" if approval.note else "."
        lines.append(f"- {approval.user_name} requested changes{said}")
    threads = [t for t in candidate_threads(candidate) if not t["resolved"]]
    if threads:
        lines.append("Open comment threads:")
    for thread in threads:
        comment = thread["comment"]
        place = f"{comment.path}:{comment.line}" if comment.line else (comment.path or "the patch")
        lines.append(f"- on {place}, {comment.author_name}: {comment.body}")
        lines.extend(f"  reply from {reply.author_name}: {reply.body}" for reply in thread["replies"])
    if note:
        lines.append(f"Note from whoever sent it back: {note}")
    return "\n".join(lines) + "\n"


def candidate_steps(candidate: Any) -> list[dict[str, Any]]:
    """Every step of the candidate, oldest first, with the receipts it wrote (two queries)."""
    steps = list(candidate.steps.order_by("id"))
    receipts = {r.pk: r for r in Receipt.objects.filter(subject_type="candidate", subject_id=candidate.pk)}
    shown: set[int] = set()
    rows = []
    for step in steps:
        own = [receipts[pk] for pk in (step.result or {}).get("receipts", []) if pk in receipts]
        shown.update(r.pk for r in own)
        rows.append({"step": step, "receipts": own})
    rest = [r for pk, r in sorted(receipts.items()) if pk not in shown]
    if rest:  # e.g. a merge, or receipts of an attempt whose worker died
        rows.append({"step": None, "receipts": rest})
    return rows


def candidate_file_stats(candidate: Any) -> list[dict[str, Any]]:
    """Per changed file: path, lines added and deleted (None for binary files)."""
    if not candidate.patch:
        return []
    text = bytes(candidate.patch)
    key = f"numstat:{hashlib.sha256(text).hexdigest()}"  # the patch's bytes: a revised patch is a new key
    numstat = caches["derived"].get(key)
    if numstat is None:
        try:
            numstat = patch_from_text(text).numstat
        except GitError:  # a stored patch git cannot read: the page shows the text without the counts
            return []
        caches["derived"].set(key, numstat)
    return [{"path": path, "added": added, "deleted": deleted} for added, deleted, path in numstat]


# ---- the search page: funnel, candidate table, score-vs-cost plot, budget

CANDIDATE_PAGE_SIZE = 100
CANDIDATE_SORTS = ("number", "state", "round", "gates", "score", "cost", "tokens", "diff")
# Every candidate state, in the order the funnel and the table's filter show them.
CANDIDATE_STATES = tuple(Candidate.State[name] for name in (
    "QUEUED", "WRITING", "EVALUATING", "ALIVE", "ELIMINATED", "WINNER", "NOT_ADMITTED", "CANCELLED"))


def candidate_rows(search: Search, sort: str = "number", state: str = "", page: int = 1) -> dict[str, Any]:
    """One page of the candidate table (baseline first on the first page), sorted and filtered;
    a fixed number of queries whatever the population."""
    descending = sort.startswith("-")
    key = sort.lstrip("-") if sort.lstrip("-") in CANDIDATE_SORTS else "number"
    fields = {"number": F("number"), "state": F("state"), "round": F("round_reached"),
              "gates": F("gates_passed"), "cost": F("cost_microusd"), "tokens": F("tokens"),
              "diff": F("diff_lines"), "score": F("score")}
    field = fields[key]
    order: list[OrderBy | str] = [
        field.desc(nulls_last=True) if descending else field.asc(nulls_last=True), "number"]
    rows = Candidate.objects.filter(search=search, number__gt=0).defer("patch", "files")
    if state in CANDIDATE_STATES:
        rows = rows.filter(state=state)
    total = rows.count()
    pages = max(1, -(-total // CANDIDATE_PAGE_SIZE))
    page = min(max(1, page), pages)
    start = (page - 1) * CANDIDATE_PAGE_SIZE
    shown = list(rows.order_by(*order)[start:start + CANDIDATE_PAGE_SIZE])
    baseline = Candidate.objects.filter(search=search, number=0).defer("patch", "files").first()
    return {"rows": shown, "baseline": baseline, "total": total, "page": page, "pages": pages,
            "sort": ("-" if descending else "") + key, "state": state if state in CANDIDATE_STATES else ""}


def candidate_spend_shown(search: Search) -> bool:
    """Whether the candidate table has Cost and Tokens columns: its writers can spend (a provider
    preset, an agent CLI through the egress proxy), or some candidate did (a command writer's
    usage report); a search of plain command writers has nothing to put there."""
    provider = ((search.spec_normalized or {}).get("worker") or {}).get("provider") or ""
    preset = preset_get(provider)
    if preset is None or preset.kind != "command":
        return True
    return Candidate.objects.filter(search=search).filter(Q(cost_microusd__gt=0) | Q(tokens__gt=0)).exists()


# A candidate in one of these states fell (the round it fell in is its round_reached; before any
# round's gates, -1, it fell in round 0: a writer that failed, a patch not admitted).
FELL_STATES = (Candidate.State.ELIMINATED, Candidate.State.NOT_ADMITTED)


def _fell_in(round_index: int, states: tuple[str, ...]) -> Q:
    reached = Q(round_reached=round_index) | Q(round_reached__lt=0) if round_index == 0 else \
        Q(round_reached=round_index)
    return Q(state__in=states) & reached


def funnel_text(step: dict[str, Any], last: bool, outcome: str) -> str:
    """One round's bar label: "12 → 5 · 7 fell" once closed, "12 → … · 3 fell so far" while it
    runs, "planned 12" before it starts, "not reached" when the search ended before it."""
    if step["state"] == "planned":
        return f"planned {step['planned']}"
    if step["state"] == "not reached":
        return "not reached"
    parts = []
    if step["state"] == "running":
        parts.append(f"{step['entered']} → …")
        if step["fell"]:
            parts.append(f"{step['fell']} fell so far")
    else:
        won = " winner" if last and outcome == SearchRun.WINNER and step["went_on"] == 1 else ""
        parts.append(f"{step['entered']} → {step['went_on']}{won}")
        if step["fell"]:
            parts.append(f"{step['fell']} fell")
    if step["cancelled"]:
        parts.append(f"{step['cancelled']} cancelled")
    return " · ".join(parts)


def search_funnel(search: Search) -> dict[str, Any]:
    """Per round: how many were planned, entered it, fell in it (eliminated or not admitted:
    round 0 counts the writers and patches that fell before any gate), were cancelled in it and
    went on past it; and how many candidates are in each state (two queries)."""
    rounds = list((search.spec_normalized or {}).get("rounds", []))
    aggregates = {f"r{i}": Count("pk", filter=Q(round_reached__gte=i)) for i in range(len(rounds))}
    aggregates.update({f"out{i}": Count("pk", filter=_fell_in(i, FELL_STATES)) for i in range(len(rounds))})
    aggregates.update({f"cut{i}": Count("pk", filter=_fell_in(i, (Candidate.State.CANCELLED,)))
                       for i in range(len(rounds))})
    aggregates.update({f"s_{name}": Count("pk", filter=Q(state=name)) for name in CANDIDATE_STATES})
    aggregates["total"] = Count("pk")
    counts = Candidate.objects.filter(search=search, number__gt=0).aggregate(**aggregates)
    run = SearchRun.objects.filter(search=search).only("status", "phase", "round_index", "outcome").first()
    population = (search.spec_normalized or {}).get("population") or 1
    steps: list[dict[str, Any]] = []
    entered: int | None = counts["total"] if run is not None else None
    for i, planned in enumerate(rounds):
        closed = run is not None and (run.terminal or run.phase != SearchRun.Phase.ROUNDS
                                      or run.round_index > i)
        fell, cancelled = counts[f"out{i}"], counts[f"cut{i}"]
        if entered is None:
            state = "planned"
        elif closed and not entered:
            state = "not reached"
        else:
            state = "closed" if closed else "running"
        went_on = max(0, (entered or 0) - fell - cancelled) if state == "closed" else None
        step = {"round": i, "planned": planned, "entered": entered or 0, "fell": fell, "cancelled": cancelled,
                "went_on": went_on, "state": state,
                # kept for readers of the old shape: reached this round's gates, fell in it
                "evaluated": counts[f"r{i}"], "eliminated": fell,
                "width": max(3, round(100 * planned / population)),
                "done": min(100, round(100 * (entered or 0) / planned)) if planned else 0}
        step["text"] = funnel_text(step, i == len(rounds) - 1, run.outcome if run else "")
        steps.append(step)
        entered = went_on if state == "closed" else (None if entered is None else 0)
        if state == "running":
            entered = None  # the rounds after the one running are still only planned
    states = {name: counts[f"s_{name}"] for name in CANDIDATE_STATES if counts[f"s_{name}"]}
    return {"rounds": steps, "states": states}


def score_points(search: Search) -> list[ScorePoint]:
    """The scored candidates (baseline included) as `plotting.score_plot` draws them (one query)."""
    rows = Candidate.objects.filter(search=search, score__isnull=False).values_list(
        "candidate_id", "number", "score", "cost_microusd", "diff_lines", "state", "spread",
        "score_low", "score_high", "score_absolute")
    return cast("list[ScorePoint]", list(rows))  # score is not null: the filter says so


# ---- the searches list

SEARCH_LIST_LIMIT = 200
# The `status` filter's values and the status each stands for.
SEARCH_LIST_STATUSES = {
    "not-started": "not started", "queued": "queued",
    **{status: status for status in SearchRun.Status.values},
}
SEARCH_LIST_OUTCOMES = ("winner", "none", "undecided")
# The `sort` values (a leading "-" means descending) and the column each orders by.
SEARCH_LIST_SORTS = {
    "created": "created_at", "name": "name", "best": "best_score", "spend": "run__spent_cost_microusd",
    "started": "run__started_at",
}
# The list refreshes itself while one of these shows.
SEARCH_LIST_LIVE = ("queued", SearchRun.Status.RUNNING, SearchRun.Status.CANCELLING)
SEARCH_LIST_WORDS = 8  # at most this many words of the text filter are matched


class SearchListAnnotations(TypedDict):
    """What `search_list_rows` adds to each search."""

    list_status: str
    score_direction: str | None
    score_metric: str | None
    score_reported: str | None
    best_score: float | None
    best_ratio: float | None
    best_low: float | None
    best_high: float | None
    baseline_score: float | None
    population: int | None
    rounds: list[int] | None


if TYPE_CHECKING:
    SearchListRow = WithAnnotations[Search, SearchListAnnotations]


def _best_field(scored: QuerySet, field: str) -> Case:
    """One field of the best scored candidate, by the spec's score direction."""
    return Case(
        When(spec_normalized__score__direction="maximize",
             then=Subquery(scored.order_by("-score").values(field)[:1])),
        default=Subquery(scored.order_by("score").values(field)[:1]), output_field=FloatField(),
    )


def search_list_rows(
    user: User, *, status: str = "", outcome: str = "", project: Any = None, text: str = "",
    sort: str = "-created",
) -> QuerySet[SearchListRow]:
    """The searches the user can see, filtered and sorted, with everything the list shows in
    one query (slice it; the count of queries does not grow with the rows):

    `list_status` — not started, queued (started, no step has run yet), running, cancelling,
    cancelled or finished; `best_score` — the best score of a non-baseline candidate, by the
    spec's score direction; `baseline_score`; `population`, `rounds`, `score_direction` and `score_metric`
    from the normalized spec; the run, repository, project and author joined in. The big frozen
    fields (spec text, hashed inputs) are not loaded.
    """
    scored = Candidate.objects.filter(search=OuterRef("pk"), number__gt=0, score__isnull=False).annotate(
        measured=Coalesce("score_absolute", "score"))
    stepped = Step.objects.filter(search=OuterRef("pk"), started_at__isnull=False)
    rows = searches_for_user(user).select_related("run", "repository").defer(
        "spec_text", "spec_normalized", "hashed_inputs", "candidate_batches",
    ).annotate(
        list_status=Case(
            When(run__isnull=True, then=Value("not started")),
            When(Q(run__status=SearchRun.Status.RUNNING) & ~Exists(stepped), then=Value("queued")),
            default=F("run__status"), output_field=CharField(),
        ),
        score_direction=KT("spec_normalized__score__direction"),
        score_metric=KT("spec_normalized__score__metric"),
        # Ranked by figure (a paired ratio or a median), shown as the metric's median value.
        best_score=Case(
            When(spec_normalized__score__direction="maximize",
                 then=Subquery(scored.order_by("-score").values("measured")[:1])),
            default=Subquery(scored.order_by("score").values("measured")[:1]), output_field=FloatField(),
        ),
        # The same best candidate's paired ratio and interval (equal to best_score when absolute).
        best_ratio=_best_field(scored, "score"), best_low=_best_field(scored, "score_low"),
        best_high=_best_field(scored, "score_high"),
        score_reported=KT("spec_normalized__score__reported"),
        baseline_score=Subquery(
            Candidate.objects.filter(search=OuterRef("pk"), number=0).order_by()
            .annotate(measured=Coalesce("score_absolute", "score")).values("measured")[:1]
        ),
        population=F("spec_normalized__population"),
        rounds=F("spec_normalized__rounds"),
    )
    if status in SEARCH_LIST_STATUSES:
        rows = rows.filter(list_status=SEARCH_LIST_STATUSES[status])
    if outcome == "winner":
        rows = rows.filter(run__outcome="winner")
    elif outcome == "none":
        rows = rows.filter(run__outcome=SearchRun.NONE)
    elif outcome == "undecided":
        rows = rows.filter(Q(run__isnull=True) | Q(run__outcome=""))
    if project is not None:
        rows = rows.filter(project=project)
    for word in text.split()[:SEARCH_LIST_WORDS]:
        rows = rows.filter(
            Q(name__icontains=word) | Q(objective__icontains=word) | Q(search_id__icontains=word)
        )
    descending = sort.startswith("-")
    column = F(SEARCH_LIST_SORTS.get(sort.removeprefix("-"), "created_at"))
    return rows.order_by(
        column.desc(nulls_last=True) if descending else column.asc(nulls_last=True),
        "-pk" if descending else "pk",
    )


# ---- compare

COMPARE_MIN = 2  # candidates picked at least …
COMPARE_MAX = 4  # … and at most
COMPARE_DIFF_MAX_BYTES = 2_000_000  # the tree diff is cut here, with a note


def compare_choices(search: Search) -> list[Any]:
    """Every candidate of the search for the compare picker, baseline first: id, number and
    state only (one query, whatever the population)."""
    return list(Candidate.objects.filter(search=search).only(
        "pk", "search_id", "candidate_id", "number", "state").order_by("number"))


def compare_pick(requested: list[str], known: list[str]) -> tuple[list[str], list[str]]:
    """The candidate ids to compare, in the order asked, and what is wrong with the request:
    ids the search does not have, an id asked twice, fewer than COMPARE_MIN or more than COMPARE_MAX.
    Blank values are ignored; nothing is picked while there is a problem."""
    known_ids = set(known)
    asked = [value.strip() for value in requested if value.strip()]
    problems: list[str] = []
    unknown = list(dict.fromkeys(value for value in asked if value not in known_ids))
    for value in unknown[:COMPARE_MAX]:
        shown = value if len(value) <= 40 else value[:40] + "…"
        problems.append(f"This search has no candidate “{shown}”.")
    if len(unknown) > COMPARE_MAX:
        problems.append(f"… and {len(unknown) - COMPARE_MAX} more unknown ids.")
    twice = [value for value, count in Counter(asked).items() if count > 1 and value in known_ids]
    for value in twice:
        problems.append(f"{value} is picked more than once; pick each candidate once.")
    distinct = len(dict.fromkeys(asked))
    if distinct < COMPARE_MIN:
        problems.append(f"Pick at least {COMPARE_MIN} candidates to compare; "
                        f"{'none is' if not distinct else f'{distinct} is'} picked.")
    elif distinct > COMPARE_MAX:
        problems.append(f"Pick at most {COMPARE_MAX} candidates to compare; {distinct} are picked.")
    return ([] if problems else asked), problems


def compare_candidates(search: Search, candidate_ids: list[str]) -> list[Any]:
    """The picked candidates, patches included, in the order picked (one query)."""
    picked = Candidate.objects.filter(search=search, candidate_id__in=candidate_ids)
    found = {candidate.candidate_id: candidate for candidate in picked}
    return [found[candidate_id] for candidate_id in candidate_ids if candidate_id in found]


def search_paired(search: Search) -> bool:
    """Whether the search's figures are paired ratios to the baseline (one query)."""
    comparison = ((search.spec_normalized or {}).get("score") or {}).get("comparison", "paired")
    state = search.candidates.filter(number=0).values_list("state", flat=True).first() or ""
    return is_paired(search.contract, comparison, state)


def _compare_tree(search: Search, candidate: Any, scratch: Any) -> str:
    """The tree of the candidate's patch applied to the search's baseline commit (the baseline
    commit's own tree for an empty patch), built in a temporary index with its objects in
    `scratch` (never the repository's): no worktree."""
    try:
        return patched_tree(search.repository_path, search.baseline_commit, bytes(candidate.patch or b""),
                            scratch=scratch)
    except GitError as error:
        raise GitError(f"{candidate.candidate_id}: {error}") from None


def compare_tree_diff(search: Search, first: Any, second: Any, limit: int | None = None) -> dict[str, Any]:
    """The unified diff from `first`'s patched tree to `second`'s, with git (hooks off):
    {"text", "truncated", "error"}. A patch that no longer applies or a repository that is
    gone gives the reason in `error` and no text; past `limit` bytes (COMPARE_DIFF_MAX_BYTES) the
    text is cut at a line."""
    limit = COMPARE_DIFF_MAX_BYTES if limit is None else limit
    # Keyed by what the diff is made of (the baseline commit and both patches' bytes), so a revised
    # patch is a new key; only a page's cut diffs are kept (a download may be any size).
    patches = [hashlib.sha256(bytes(c.patch or b"")).hexdigest() for c in (first, second)]
    parts = [search.repository_path, search.baseline_commit, str(limit), *patches]
    key = "compare-diff:" + hashlib.sha256("\0".join(parts).encode()).hexdigest()
    cacheable = limit <= COMPARE_DIFF_MAX_BYTES
    if cacheable and (cached := caches["derived"].get(key)) is not None:
        return cached
    try:
        with object_scratch(search.repository_path) as scratch:
            trees = [_compare_tree(search, candidate, scratch) for candidate in (first, second)]
            out = git_run(["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--src-prefix=a/",
                           "--dst-prefix=b/", trees[0], trees[1], "--"], cwd=Path(search.repository_path),
                          env=scratch.env)
    except (GitError, OSError) as error:
        return {"text": "", "truncated": False, "error": str(error) or error.__class__.__name__}
    truncated = len(out) > limit
    if truncated:
        out = out[:limit]
        out = out[: out.rfind(b"\n") + 1] or out
    diff = {"text": out.decode(errors="replace"), "truncated": truncated, "error": ""}
    if cacheable:
        caches["derived"].set(key, diff)
    return diff


def diff_anchors(candidate: Any) -> dict[str, dict[str, list[int]]]:
    """Per changed file and side ("old", "new"), the lines a thread may start on: what the page
    offers to click."""
    text = bytes(candidate.patch or b"").decode(errors="replace")
    return {path: {side: diff_lines(text, path, side) for side in Comment.Side.values}
            for path in (candidate.files or [])}


def candidate_threads(candidate: Any) -> list[dict[str, Any]]:
    """The candidate's threads, oldest first, each with its replies (one query) and whether it is
    outdated: made on an earlier patch whose line the current diff no longer shows, or shows with
    other text (a file thread: its file is no longer changed). Outdated threads are kept, with the
    line as it read when they were made."""
    comments = list(candidate.comments.order_by("created_at", "id"))
    text = bytes(candidate.patch or b"").decode(errors="replace")
    shown: dict[tuple[str, str], dict[int, str]] = {}
    replies: dict[int, list[Any]] = {}
    for comment in comments:
        if comment.reply_to_id is not None:
            replies.setdefault(comment.reply_to_id, []).append(comment)
    threads = []
    for comment in comments:
        if comment.reply_to_id is not None:
            continue
        outdated = False
        if comment.path and comment.patch_sha256 and comment.patch_sha256 != candidate.patch_sha256:
            if comment.line is None:
                outdated = comment.path not in (candidate.files or [])
            else:
                place = (comment.path, comment.side)
                if place not in shown:
                    shown[place] = diff_line_texts(text, comment.path, comment.side)
                outdated = shown[place].get(comment.line) != comment.line_text
        threads.append({"comment": comment, "replies": replies.get(comment.pk, []), "outdated": outdated,
                        "resolved": comment.state == comment.State.RESOLVED,
                        "inline": bool(comment.line) and not outdated})
    return threads


# ---- the forecast before launch

FORECAST_HISTORY_SEARCHES = 20  # the newest finished searches of a repository a forecast reads
FORECAST_SAMPLE = 2000  # at most this many of the newest durations of each kind


def _command_text(argv: list[str]) -> str:
    """The command line a spec gave (`/bin/sh -c LINE` runs it), to match durations by command."""
    if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]:
        return argv[2]
    return shlex.join(argv)


def _durations(receipts: QuerySet, word: str) -> dict[str, tuple[float, ...]]:
    rows = receipts.filter(label__contains=f" {word} ").order_by("-id").values_list(
        "argv", "duration_seconds", "detail__cancelled")[:FORECAST_SAMPLE]
    found: dict[str, list[float]] = {}
    for argv, seconds, cancelled in rows:
        if not cancelled:
            found.setdefault(_command_text(argv or []), []).append(seconds)
    return {command: tuple(values) for command, values in found.items()}


def forecast_history(project_pk: int, repository_path: str, provider: str, requested_model: str, *,
                     exclude_pk: int | None = None) -> History:
    """What the newest finished searches of the repository (in the same project) left: writer
    steps of the same provider and model (or command line), their model-call receipts' totals,
    and gate and trial durations by command, and their finished steps (which time the wall-time
    forecast). Seven queries, however many searches, steps and receipts."""
    past = Search.objects.filter(project_id=project_pk, repository_path=repository_path,
                                 run__status=SearchRun.Status.FINISHED)
    if exclude_pk is not None:
        past = past.exclude(pk=exclude_pk)
    rows = list(past.order_by("-run__finished_at", "-pk").values_list(
        "pk", "spec_normalized__worker__provider", "requested_model_id")[:FORECAST_HISTORY_SEARCHES])
    if not rows:
        return History()
    searches = [pk for pk, _, _ in rows]
    writers = [pk for pk, used, model in rows if used == provider and model == requested_model]
    steps = Step.objects.filter(search_id__in=writers, kind=Step.Kind.GENERATE)
    spans = steps.filter(state=Step.State.DONE, started_at__isnull=False, finished_at__isnull=False).order_by(
        "-id").values_list("started_at", "finished_at")[:FORECAST_SAMPLE]
    calls = Receipt.objects.filter(
        kind="llm_call", subject_type="candidate", label__contains=" writer call ",
        subject_id__in=Candidate.objects.filter(search_id__in=writers).values("pk"),
    ).aggregate(calls=Count("pk"), cost=Sum("cost_microusd"), input=Sum("input_tokens"),
                output=Sum("output_tokens"), read=Sum("cache_read_tokens"), write=Sum("cache_write_tokens"))
    commands = Receipt.objects.filter(
        kind="command", subject_type="candidate", error="",
        subject_id__in=Candidate.objects.filter(search_id__in=searches).values("pk"),
    )
    # Every finished step of the searches read; writer steps only of the same provider and model,
    # as a different writer takes a different time.
    past_steps = Step.objects.filter(
        Q(search_id__in=writers) | (Q(search_id__in=searches) & ~Q(kind=Step.Kind.GENERATE)),
        state__in=(Step.State.DONE, Step.State.FAILED), started_at__isnull=False, finished_at__isnull=False,
    ).order_by("-id").values_list(
        "kind", "round", "state", "started_at", "finished_at", "plan")[:FORECAST_SAMPLE]
    return History(
        steps=tuple(StepSample(kind=kind, round=round_index, state=state, trials=_planned_trials(plan),
                               seconds=max((end - start).total_seconds(), 0.0))
                    for kind, round_index, state, start, end, plan in past_steps
                    if start is not None and end is not None),  # (the filter says so)
        searches=len(searches), writer_searches=len(writers),
        writer_seconds=tuple((end - start).total_seconds() for start, end in spans
                             if start is not None and end is not None),  # (the filter says so)
        writer_steps=steps.filter(state__in=(Step.State.DONE, Step.State.FAILED)).count() if writers else 0,
        writer_calls=calls["calls"], writer_cost_microusd=calls["cost"] or 0,
        writer_tokens=sum(calls[name] or 0 for name in ("input", "output", "read", "write")),
        gate_seconds=_durations(commands, "gate"), trial_seconds=_durations(commands, "trial"),
    )


def _forecast_with(spec: SearchSpec, project_pk: int, repository_path: str, requested: str, resolved: str,
                   exclude_pk: int | None = None) -> Forecast:
    preset = preset_get(spec.worker.provider)
    history = forecast_history(project_pk, repository_path, spec.worker.provider, requested,
                               exclude_pk=exclude_pk)
    price, label = None, ""
    if preset is not None and preset.kind != "command":
        entry = preset.price_model or resolved
        price, version = price_for(entry)
        label = f"{entry} (table {version})"
    return forecast(spec, history, price=price, price_label=label, model=resolved)


def search_forecast(search: Search) -> Forecast:
    """The forecast of a frozen search, from its frozen spec and model and its repository's history."""
    return _forecast_with(search_spec(search), search.project_id, search.repository_path,
                          search.requested_model_id, search.resolved_model_id or search.requested_model_id,
                          exclude_pk=search.pk)


def search_started(search: Search) -> bool:
    return SearchRun.objects.filter(search=search).exists()


def search_forecast_before_start(search: Search) -> Forecast | None:
    """The forecast while the search has not started (None once it has: its run says the rest)."""
    return None if search_started(search) else search_forecast(search)


def spec_forecast(spec: SearchSpec, project_pk: int, repository_path: str) -> Forecast:
    """The forecast of a spec not frozen yet, against a repository's history: nothing is written."""
    requested = spec.worker.model or spec.worker.command
    resolved, _ = preset_resolve_model(spec.worker.provider, requested)
    return _forecast_with(spec, project_pk, repository_path, requested, resolved)


# ---- the project page (runtime_app/subjects.py project_section_register)

PROJECT_PAGE_ROWS = 10  # searches and specs shown on a project's page; the lists have the rest
PROJECT_PAGE_ATTENTION = 20  # awaiting winners checked for approvals on one page view


def project_searches_section(user: User, project: Any) -> Any:
    """The project's specs and latest searches, and what needs someone: winners awaiting
    approval (or approved and ready to merge), searches stopped by a command that cannot
    start, and searches running now."""
    rows = search_list_rows(user, project=project)
    attention = []
    awaiting = rows.filter(run__outcome="winner", merge__isnull=True).select_related("run__winner")
    for search in awaiting[:PROJECT_PAGE_ATTENTION]:
        winner = search.run.winner
        if winner is None:
            continue
        approved = approval_state(winner)["mergeable"]
        attention.append(Attention(
            "awaiting approval", f"{search.name}: {winner.candidate_id} "
            + ("is approved and ready to merge" if approved else "awaits approval"),
            reverse("search_merge" if approved else "candidate_decide",
                    args=[search.search_id] if approved else [search.search_id, winner.candidate_id]),
            search.search_id, search.run.finished_at))
    stopped = set(Step.objects.filter(search__project=project, result__has_key="spec_failure")
                  .values_list("search_id", flat=True))
    for search in rows.filter(pk__in=stopped)[:PROJECT_PAGE_ATTENTION]:
        attention.append(Attention("failed", f"{search.name}: a command of its spec cannot start",
                                   reverse("search_detail", args=[search.search_id]), search.search_id,
                                   search.run.finished_at or search.run.updated_at))
    # django-stubs types an annotation's `__in` lookup as the annotation's own type, not a collection.
    for search in rows.filter(list_status__in=SEARCH_LIST_LIVE)[:PROJECT_PAGE_ATTENTION]:  # type: ignore[misc]
        attention.append(Attention("running", f"{search.name} is {search.list_status}",
                                   reverse("search_detail", args=[search.search_id]), search.search_id,
                                   search.run.started_at))
    specs = Spec.objects.filter(project=project).annotate(latest_number=Max("versions__number"))
    return ProjectSection(
        "searches", "Specs and searches", "search_app/_project_section.html",
        {"searches": list(rows[:PROJECT_PAGE_ROWS]), "search_count": rows.count(),
         "specs": list(specs.order_by("-updated_at")[:PROJECT_PAGE_ROWS]), "spec_count": specs.count()},
        attention)


# ---- the candidate's review timeline


def candidate_timeline(candidate: Any, threads: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What happened in the candidate's review, in time order: threads (with their replies),
    threads resolved and reopened, people's decisions (with their notes) and withdrawn ones,
    reviewer verdicts, replays, refinements of its patch and its merge. Each entry has `at`,
    `kind` and the row it is about; a few queries whatever the length. Give `threads` when read
    already (candidate_threads)."""
    search = candidate.search
    entries: list[dict[str, Any]] = []
    for thread in candidate_threads(candidate) if threads is None else threads:
        entries.append({"at": thread["comment"].created_at, "kind": "thread", "thread": thread})
    changes = AuditEntry.objects.filter(
        project_id=search.project_id, action__in=("comment.resolve", "comment.reopen"),
        target__startswith=f"{search.search_id} {candidate.candidate_id} #").order_by("id")
    for change in changes:
        entries.append({"at": change.created_at, "kind": "resolved" if change.action == "comment.resolve"
                        else "reopened", "by": change.actor_name, "thread_id": change.detail.get("comment")})
    for approval in candidate.approvals.order_by("created_at", "id"):
        approval.candidate = candidate  # `stale` compares with this candidate's current hash
        entries.append({"at": approval.created_at, "kind": "decision", "approval": approval})
        if approval.withdrawn_at is not None:
            entries.append({"at": approval.withdrawn_at, "kind": "withdrawn", "approval": approval})
    for review in candidate.reviews.order_by("created_at", "id"):
        entries.append({"at": review.created_at, "kind": "review", "review": review})
    for step in candidate.steps.filter(state=Step.State.DONE,
                                           kind__in=(Step.Kind.REPLAY, Step.Kind.GENERATE)).order_by("id"):
        result = step.result or {}
        if step.kind == Step.Kind.REPLAY:
            undecided = "passed" in result and result["passed"] is None  # it went on with more blocks
            entries.append({"at": step.finished_at or step.created_at, "kind": "replay", "step": step,
                            "passed": bool(result.get("passed")), "undecided": undecided,
                            "why": result.get("why", "")})
        elif step.refines:
            if result.get("eliminated"):
                outcome = f"the refinement failed ({result['eliminated']}); it kept its earlier patch"
            else:
                outcome = f"its writer wrote patch {short_sha(str(result.get('patch_sha256', '')))}"
            entries.append({"at": step.finished_at or step.created_at, "kind": "refinement", "step": step,
                            "outcome": outcome})
    for step in candidate.steps.filter(kind=Step.Kind.GENERATE, plan__revision__isnull=False).order_by("id"):
        entries.append({"at": step.created_at, "kind": "revision", "number": step.plan["revision"],
                        "by": step.plan.get("requested_by", ""), "note": step.plan.get("note", "")})
        ended = parse_datetime(str((step.result or {}).get("revision_ended_at", "")))
        if ended is not None:
            entries.append({"at": ended, "kind": "revised", "passed": step.result.get("revision_passed"),
                            "outcome": step.result.get("revision_outcome", "")})
    merge = Merge.objects.filter(search=search, candidate=candidate).first()
    if merge is not None:
        entries.append({"at": merge.created_at, "kind": "merge", "merge": merge})
    order = {"thread": 0, "resolved": 1, "reopened": 1, "revision": 2, "refinement": 2, "replay": 3,
             "review": 4, "revised": 5, "decision": 5, "withdrawn": 6, "merge": 7}
    entries.sort(key=lambda entry: (entry["at"], order[entry["kind"]]))
    return entries
