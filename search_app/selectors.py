"""Reads for search_app, filtered by project access."""

from __future__ import annotations

import difflib
from typing import Any

from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import Http404

from runtime_app.selectors import projects_for_user
from search_app.models import Search, Spec, SpecVersion


def specs_for_user(user: Any) -> QuerySet[Spec]:
    return Spec.objects.select_related("project").filter(project__in=projects_for_user(user))


def spec_list_for_user(user: Any) -> QuerySet[Spec]:
    """Specs with their number of versions and the latest version's number and validity."""
    latest = SpecVersion.objects.filter(spec=OuterRef("pk")).order_by("-number")
    return specs_for_user(user).select_related("created_by").annotate(
        version_count=Count("versions"),
        latest_number=Subquery(latest.values("number")[:1]),
        latest_valid=Subquery(latest.values("valid")[:1]),
    )


def spec_for_user(user: Any, spec_id: int) -> Spec:
    spec = specs_for_user(user).filter(pk=spec_id).first()
    if spec is None:
        raise Http404("No such spec.")
    return spec


def spec_version_get(spec: Spec, number: int) -> SpecVersion:
    version = spec.versions.filter(number=number).first()
    if version is None:
        raise Http404(f"{spec.title} has no version {number}.")
    return version


def _diff_lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):  # else the diff glues `-last` and `+last` together
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def spec_diff(old: SpecVersion, new: SpecVersion) -> str:
    """A unified diff between two versions of a spec."""
    return "".join(difflib.unified_diff(
        _diff_lines(old.text), _diff_lines(new.text),
        fromfile=f"v{old.number}", tofile=f"v{new.number}",
    ))


def searches_for_user(user: Any) -> QuerySet[Search]:
    return Search.objects.select_related("project", "created_by").filter(
        project__in=projects_for_user(user)
    )


def search_for_user(user: Any, search_id: str) -> Search:
    search = searches_for_user(user).filter(search_id=search_id).first()
    if search is None:
        raise Http404("No such search.")
    return search


def search_run_report(search: Search) -> dict[str, Any]:
    """The run's state, budget, funnel and every candidate with its fate and receipts (JSON-ready)."""
    from runtime_app.models import Receipt
    from search_app.models import SearchRun

    run = SearchRun.objects.filter(search=search).select_related("winner").first()  # never a stale cache
    candidates = list(search.candidates.order_by("number"))
    receipts: dict[int, list[int]] = {}
    for candidate_pk, receipt_pk in Receipt.objects.filter(
        subject_type="candidate", subject_id__in=[c.pk for c in candidates]
    ).values_list("subject_id", "pk"):
        receipts.setdefault(candidate_pk, []).append(receipt_pk)
    counts: dict[str, int] = {}
    for candidate in candidates:
        if candidate.number:
            counts[candidate.state] = counts.get(candidate.state, 0) + 1
    review = search.reviews.order_by("-id").first()
    from django.db.models import Count, Sum

    calls = Receipt.objects.filter(subject_type="candidate", subject_id__in=[c.pk for c in candidates],
                                   kind="llm_call").aggregate(
        calls=Count("id"), input=Sum("input_tokens"), read=Sum("cache_read_tokens"),
        write=Sum("cache_write_tokens"), output=Sum("output_tokens"), cost=Sum("cost_microusd"))
    prompt_tokens = (calls["input"] or 0) + (calls["read"] or 0) + (calls["write"] or 0)
    return {
        "search_id": search.search_id,
        "name": search.name,
        "status": run.status if run else "not started",
        "phase": run.phase if run else "",
        "round": run.round_index if run else None,
        "outcome": run.outcome if run else "",
        "winner": run.winner.candidate_id if run and run.winner else None,
        "reason": run.reason if run else "",
        "budget": {
            "max_cost_microusd": run.budget_cost_microusd if run else None,
            "max_tokens": run.budget_tokens if run else None,
            "spent_cost_microusd": run.spent_cost_microusd if run else 0,
            "spent_tokens": run.spent_tokens if run else 0,
            "reserved_cost_microusd": run.reserved_cost_microusd if run else 0,
            "reserved_tokens": run.reserved_tokens if run else 0,
        },
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
                   "findings": review.findings} if review else None,
        "candidates": [
            {
                "candidate_id": c.candidate_id, "state": c.state, "round_reached": c.round_reached,
                "gates_passed": c.gates_passed, "score": c.score, "spread": c.spread, "trials": c.trials,
                "cost_microusd": c.cost_microusd, "tokens": c.tokens, "diff_lines": c.diff_lines,
                "patch_sha256": c.patch_sha256, "reason": c.reason, "receipts": receipts.get(c.pk, []),
            }
            for c in candidates
        ],
    }


def search_receipts(user: Any, search: Search) -> QuerySet:
    from runtime_app.selectors import receipts_for_user

    candidate_ids = list(search.candidates.values_list("pk", flat=True))
    return receipts_for_user(user).filter(subject_type="candidate", subject_id__in=candidate_ids)


def step_search_pk(step_pk: int) -> int | None:
    from search_app.models import Step

    return Step.objects.filter(pk=step_pk).values_list("search_id", flat=True).first()


# ---- candidates, review and approval


def candidate_for_user(user: Any, search_id: str, candidate_id: str) -> Any:
    """A candidate of a search the user can see (404 otherwise, the same for outsiders)."""
    from search_app.models import Candidate

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
    from search_app.models import SearchRun, Step

    run = SearchRun.objects.filter(search=search).first()
    if run is None or run.winner_id is None:
        return None
    step = Step.objects.filter(search=search, candidate_id=run.winner_id, kind="replay", state="done",
                               result__passed=True).order_by("-id").first()
    if step is None:
        return None
    return {"why": step.result.get("why", ""), "receipts": step.result.get("receipts", []),
            "score": step.result.get("score")}


def approval_state(candidate: Any) -> dict[str, Any]:
    """Each person's standing decision on the candidate, which of them count, and whether the
    winner may be merged (enough current approvals by approvers, no current request for changes)."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from runtime_app import roles

    history = list(candidate.approvals.order_by("created_at", "id"))
    decisions: dict[int | None, Any] = {}
    for approval in history:
        approval.candidate = candidate  # `stale` compares with this candidate's current hash
        decisions[approval.user_id] = approval
    approvers = {user.pk: user for user in get_user_model().objects.filter(
        pk__in=[pk for pk in decisions if pk is not None], is_active=True)}
    standing = [a for a in decisions.values() if a.decision == "approve" and not a.stale
                and a.user_id in approvers and approvers[a.user_id].has_perm(roles.APPROVE)]
    changes = [a for a in decisions.values() if a.decision == "request_changes" and not a.stale]
    required = settings.CONFIG.required_approvals
    blocker = ""
    if changes:
        blocker = f"{', '.join(a.user_name for a in changes)} requested changes."
    elif len(standing) < required:
        blocker = f"It needs {required} approval{'s' if required != 1 else ''} on the current patch; " \
                  f"it has {len(standing)}."
    return {"history": history, "decisions": decisions, "standing_approvals": standing,
            "changes_requested": changes, "required": required, "mergeable": not blocker,
            "blocker": blocker, "stale": [a for a in history if a.stale]}


def candidate_steps(candidate: Any) -> list[dict[str, Any]]:
    """Every step of the candidate, oldest first, with the receipts it wrote (two queries)."""
    from runtime_app.models import Receipt

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
    from runtime_app.worktrees import patch_from_text

    if not candidate.patch:
        return []
    return [{"path": path, "added": added, "deleted": deleted}
            for added, deleted, path in patch_from_text(bytes(candidate.patch)).numstat]


# ---- the searches list

SEARCH_LIST_LIMIT = 200
# The `status` filter's values and the status each stands for.
SEARCH_LIST_STATUSES = {
    "not-started": "not started", "queued": "queued", "running": "running", "cancelling": "cancelling",
    "cancelled": "cancelled", "finished": "finished",
}
SEARCH_LIST_OUTCOMES = ("winner", "none", "undecided")
# The `sort` values (a leading "-" means descending) and the column each orders by.
SEARCH_LIST_SORTS = {
    "created": "created_at", "name": "name", "best": "best_score", "spend": "run__spent_cost_microusd",
    "started": "run__started_at",
}
SEARCH_LIST_LIVE = ("queued", "running", "cancelling")  # the list refreshes itself while one shows
SEARCH_LIST_WORDS = 8  # at most this many words of the text filter are matched


def search_list_rows(
    user: Any, *, status: str = "", outcome: str = "", project: Any = None, text: str = "",
    sort: str = "-created",
) -> QuerySet[Search]:
    """The searches the user can see, filtered and sorted, with everything the list shows in
    one query (slice it; the count of queries does not grow with the rows):

    `list_status` — not started, queued (started, no step has run yet), running, cancelling,
    cancelled or finished; `best_score` — the best score of a non-baseline candidate, by the
    spec's score direction; `baseline_score`; `population`, `rounds` and `score_direction` from
    the normalized spec; the run, repository, project and author joined in. The big frozen
    fields (spec text, hashed inputs) are not loaded.
    """
    from django.db.models import Case, CharField, Exists, F, FloatField, Q, Value, When
    from django.db.models.fields.json import KT

    from search_app.models import Candidate, Step

    scored = Candidate.objects.filter(search=OuterRef("pk"), number__gt=0, score__isnull=False)
    stepped = Step.objects.filter(search=OuterRef("pk"), started_at__isnull=False)
    rows = searches_for_user(user).select_related("run", "repository").defer(
        "spec_text", "spec_normalized", "hashed_inputs", "candidate_batches",
    ).annotate(
        list_status=Case(
            When(run__isnull=True, then=Value("not started")),
            When(Q(run__status="running") & ~Exists(stepped), then=Value("queued")),
            default=F("run__status"), output_field=CharField(),
        ),
        score_direction=KT("spec_normalized__score__direction"),
        best_score=Case(
            When(spec_normalized__score__direction="maximize",
                 then=Subquery(scored.order_by("-score").values("score")[:1])),
            default=Subquery(scored.order_by("score").values("score")[:1]), output_field=FloatField(),
        ),
        baseline_score=Subquery(
            Candidate.objects.filter(search=OuterRef("pk"), number=0).order_by().values("score")[:1]
        ),
        population=F("spec_normalized__population"),
        rounds=F("spec_normalized__rounds"),
    )
    if status in SEARCH_LIST_STATUSES:
        rows = rows.filter(list_status=SEARCH_LIST_STATUSES[status])
    if outcome == "winner":
        rows = rows.filter(run__outcome="winner")
    elif outcome == "none":
        rows = rows.filter(run__outcome="NONE")
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
