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
