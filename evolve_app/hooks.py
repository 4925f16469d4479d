"""How evolve_app plugs into the runtime: its agents as subjects and its project section.
EvolveAppConfig.ready() imports this module (it imports models, so not before the app registry
is ready) and calls connect()."""

from __future__ import annotations

from typing import Any

from evolve_app.models import Agent
from evolve_app.selectors import project_agents_section
from evolve_app.waiting import EVENT_KINDS as WAITING_EVENT_KINDS
from evolve_app.waiting import evolve_waiting
from runtime_app.subjects import project_section_register, subject_label_register, subject_type_register
from runtime_app.waiting import waiting_register


def agent_project(subject_id: int) -> int | None:
    return Agent.objects.filter(pk=subject_id).values_list("project_id", flat=True).first()


def agents_section(user: Any, project: Any) -> Any:
    return project_agents_section(user, project)


def agent_labels(ids: list[int]) -> dict[int, str]:
    names = Agent.objects.filter(pk__in=ids).values_list("pk", "name")
    return {pk: f"agent {name}" for pk, name in names}


def connect() -> None:
    subject_label_register("agent", agent_labels)
    subject_type_register("agent", agent_project)
    project_section_register("agents", 20, agents_section)
    waiting_register("agents", evolve_waiting, WAITING_EVENT_KINDS)
