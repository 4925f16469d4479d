"""evolve_app's part of "Waiting for you" (runtime_app/waiting.py): evolution runs whose cycle
holds a change for review, for the people who may decide it (the approve permission)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from evolve_app.models import Cycle, EvolutionRun
from evolve_app.status import run_statuses
from runtime_app import access
from runtime_app.waiting import WaitingItem, WaitingKind

MAX_ITEMS = 50
EVENT_KINDS = ("evolution.", "cycle.")


def evolve_waiting(user: Any) -> list[WaitingItem]:
    projects = access.projects_with_role(user, access.APPROVER)
    runs = list(EvolutionRun.objects.filter(agent__project__in=projects,
                                            status=EvolutionRun.Status.AWAITING_REVIEW)
                .select_related("agent__project").order_by("-created_at")[:MAX_ITEMS])
    statuses = run_statuses(runs)
    waiting = {cycle.run_id: cycle for cycle in Cycle.objects.filter(
        run__in=runs, status=Cycle.Status.AWAITING_REVIEW).order_by("number")}
    items = []
    for run in runs:
        agent, cycle = run.agent, waiting.get(run.pk)
        url = (reverse("cycle_detail", args=[agent.pk, run.number, cycle.number]) if cycle is not None
               else reverse("evolution_run_detail", args=[agent.pk, run.number]))
        what = f"cycle {cycle.number}" if cycle is not None else "a cycle"
        items.append(WaitingItem(
            WaitingKind.REVIEW, agent.project_id, agent.project.name,
            f"Review {what} of {agent.name} run {run.number}", url,
            detail=(cycle.summary[:120] if cycle is not None and cycle.summary
                    else "a mutation waits for a decision"),
            status=statuses[run.pk].label, when=cycle.created_at if cycle is not None else run.created_at,
            key=f"review-{run.pk}"))
    return items
