"""evolve_app's part of the demo project `crucible_setup` makes: the offline demo agent (not
evolve_app/demo/, its workspace; EvolveAppConfig.demo_setup names this)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from evolve_app.models import Agent
from evolve_app.services import demo_agent_create, evolution_run_start
from runtime_app.models import Project


def demo_setup(admin: AbstractBaseUser, project: Project, write: Callable[[str], None]) -> None:
    """The offline demo agent, with a 4-cycle evolution queued for the workers `make run`
    starts: its score climbs from 0.25 to 1.00 with no API key. Nothing if the project has an agent."""
    if Agent.objects.filter(project=project).exists():
        return
    with transaction.atomic():
        agent = demo_agent_create(admin, project)
        evolution_run_start(admin, agent, benchmark="demo", engine="textbook", cycles=4)
    write(f"Demo agent {agent.name}: a 4-cycle evolution is queued (see /agents/).")
