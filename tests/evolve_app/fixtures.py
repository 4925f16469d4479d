"""evolve_app fixtures that tests outside tests/evolve_app use too (they import them from here;
tests/evolve_app/conftest.py re-exports them)."""

from __future__ import annotations

import pytest


@pytest.fixture
def demo_agent(personas, tmp_path, settings):
    """A fresh copy of the offline demo agent in project alpha (its workspace tagged evo-0)."""
    from evolve_app import services

    settings.DATA_DIR = tmp_path
    return services.demo_agent_create(personas.owner, personas.alpha)
