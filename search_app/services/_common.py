"""What the lifecycles of a search share: its events, a candidate's elimination, the budget
reservation test and the figures a round and a replay compare by."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runtime_app.presenters import short_sha
from runtime_app.services import event_emit
from search_app.execution import parked_trees_remove
from search_app.measurement import Interval, is_paired, min_blocks
from search_app.models import Candidate, Merge, Search, SearchRun, Step
from search_app.selectors import approval_state, winner_standing

if TYPE_CHECKING:
    from search_app.spec import SearchSpec

logger = logging.getLogger(__name__)


def _lease_seconds() -> int:
    return settings.CONFIG.step_lease_seconds


_ENDED_EVENTS = ("search.finished", "search.cancelled")


def _search_event(search: Search, kind: str, message: str, **payload: Any) -> None:
    event_emit(search.project, "search", search.pk, kind, {"message": message, **payload})
    if kind in _ENDED_EVENTS:  # no trial will use an evaluation tree parked on this host any more
        transaction.on_commit(lambda: _parked_trees_release(search))


def _parked_trees_release(search: Search) -> None:
    try:
        parked_trees_remove(search)
    except Exception:  # the search has ended either way: a tree left behind costs only disk
        logger.exception("could not remove the parked evaluation trees of search %s", search.search_id)


def _candidate_event(candidate: Candidate, message: str) -> None:
    _search_event(
        candidate.search, "candidate.updated", f"{candidate.candidate_id}: {message}",
        candidate_id=candidate.candidate_id, state=candidate.state, round=candidate.round_reached,
        score=candidate.score, reason=candidate.reason,
    )


def _reservation(run: SearchRun, concurrency: int) -> tuple[int, int]:
    """A writer's worst case: it may spend up to the budget's share of one live slot."""
    cost = run.budget_cost_microusd // concurrency if run.budget_cost_microusd else 0
    tokens = run.budget_tokens // concurrency if run.budget_tokens else 0
    return cost, tokens


def _fits(run: SearchRun, cost: int, tokens: int) -> bool:
    if run.budget_cost_microusd and run.spent_cost_microusd + run.reserved_cost_microusd + cost > \
            run.budget_cost_microusd:
        return False
    return not (run.budget_tokens and run.spent_tokens + run.reserved_tokens + tokens > run.budget_tokens)


def comparison_for(search: Search, spec: SearchSpec, baseline: Any) -> str:
    """How this search compares candidates now: `paired` (per-block ratios to the baseline) when
    its spec asks for it and the baseline is measured; `absolute` otherwise, and always for a
    search frozen before paired blocks existed (contract 1), which runs as it was frozen."""
    return "paired" if is_paired(search.contract, spec.score.comparison, baseline.state) else "absolute"


def _interval(candidate: Any, spec: SearchSpec) -> Any:
    return Interval(candidate.score, candidate.score_low, candidate.score_high, spec.score.confidence,
                    len(candidate.blocks.get(str(candidate.round_reached), {})))


def _carry_on(candidate: Candidate, round_index: int) -> None:
    """A patch that passed its gates goes into `round_index`'s blocks as it is."""
    candidate.state, candidate.round_reached = Candidate.State.ALIVE, round_index
    candidate.save(update_fields=["state", "round_reached", "updated_at"])


def _refinement_kept(candidate: Candidate, step: Step, why: str) -> None:
    """A refinement that fails costs the candidate nothing: it goes on with the patch it had."""
    _carry_on(candidate, step.round)
    _candidate_event(candidate, f"round {step.round}: refinement failed ({why}); keeps its round "
                                f"{candidate.patch_round} patch")


def _one_line(text: str) -> str:
    """Reasons are shown in tables and event logs: keep each on one line."""
    return re.sub(r"\s*\n\s*(?:-\s*)?", "; ", text.strip()).replace(":;", ":")


def _eliminate(candidate: Candidate, reason: str) -> None:
    candidate.state, candidate.reason = Candidate.State.ELIMINATED, _one_line(reason)
    candidate.save(update_fields=["state", "reason", "duplicate_of", "updated_at"])
    _candidate_event(candidate, f"eliminated — {reason}")


def review_blocks(search: Search, spec: SearchSpec) -> bool:
    """Whether a reviewer's reject eliminates a provisional winner: `selection.review` says so,
    and the search was frozen after reviews could block (contract 3); older ones run as frozen."""
    return search.contract >= 3 and spec.selection.review == "blocking"


def _winner_reason(winner: Candidate, verdict: str | None = None) -> str:
    """A winner's reason: how it won, then where it stands with people (selectors.winner_standing)
    — awaiting approval, approved, changes requested or merged — so every page, the API and the
    CLI say the same once someone decides."""
    if verdict is None:
        review = winner.reviews.order_by("-id").first()
        verdict = review.verdict if review else "nothing"
    approval = approval_state(winner)
    merge = Merge.objects.filter(search_id=winner.search_id).first()
    standing = winner_standing(approval, merge is not None)
    approvers = ", ".join(a.user_name for a in approval["standing_approvals"])
    text = f"winner: replay passed; reviewer says {verdict}"
    if standing == "merged" and merge is not None:
        return (f"{text}; merged onto {merge.branch} as {short_sha(merge.commit_sha)} "
                f"by {merge.merged_by_name}")
    if standing == "approved":
        return f"{text}; approved by {approvers}; ready to merge"
    if standing == "changes requested":
        return f"{text}; changes requested by {', '.join(a.user_name for a in approval['changes_requested'])}"
    if approvers:
        return f"{text}; approved by {approvers} ({len(approval['standing_approvals'])} of " \
               f"{approval['required']} needed); awaiting human approval"
    return f"{text}; awaiting human approval"


def _winner_reason_refresh(winner: Candidate) -> None:
    """After a decision or a merge: the winner's and its run's reason say where it stands now."""
    winner.reason = _winner_reason(winner)
    winner.save(update_fields=["reason", "updated_at"])
    SearchRun.objects.filter(search_id=winner.search_id, winner=winner).update(reason=winner.reason,
                                                                             updated_at=timezone.now())


def _replay_values(step: Step, candidate: Candidate, result: dict, field: str = "values"
                   ) -> dict[str, dict[int, float]]:
    """The replay's values (or another of its figures by member and block: `durations`, `cpu`,
    `rss`) by member and block: this step's and those of the replay steps it extends (one
    replay, measured in more than one step when it needed more blocks)."""
    merged: dict[str, dict[int, float]] = {}
    earlier = Step.objects.filter(search=step.search, candidate=candidate, kind=Step.Kind.REPLAY,
                                  state=Step.State.DONE, plan__namespace=step.plan.get("namespace")
                                  ).exclude(pk=step.pk)
    for source in [*(s.result for s in earlier.order_by("id")), result]:
        for member, by_block in (source.get(field) or {}).items():
            merged.setdefault(member, {}).update({int(block): v for block, v in by_block.items()})
    return merged


def _replay_more_blocks(spec: SearchSpec, have: int) -> int:
    """Blocks to add to a replay that cannot decide yet: enough to decide at its confidence, in
    steps of `trials`, never past the ceiling."""
    return min(spec.score.trials_ceiling - have, max(spec.score.trials, min_blocks(spec.score.confidence)))
