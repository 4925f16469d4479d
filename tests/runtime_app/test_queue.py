"""Services queue Celery tasks by name (runtime_app/queue.py): every name they use is a registered
task, and a send reaches that task with its arguments."""

from __future__ import annotations

import ast

import pytest
from celery import current_app

from runtime_app.queue import task_send
from tests.helpers import REPO_ROOT


def names_queued_by_the_apps() -> set[str]:
    """The first argument of every `task_send(...)` call in the apps' code."""
    names = set()
    for package in ("runtime_app", "search_app", "evolve_app"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "task_send"):
                    first = node.args[0]
                    assert isinstance(first, ast.Constant), f"{path}: task_send needs a literal task name"
                    names.add(first.value)
    return names


def test_every_task_the_services_queue_by_name_is_a_registered_task():
    current_app.loader.import_default_modules()  # what a worker does on start: autodiscover the tasks
    names = names_queued_by_the_apps()
    assert {"search_app.tasks.search_drive", "evolve_app.tasks.evolution_run",
            "runtime_app.tasks.webhook_deliver", "runtime_app.tasks.project_ping_reply"} <= names
    assert names <= set(current_app.tasks), sorted(names - set(current_app.tasks))


@pytest.fixture
def eager_echo():
    """A task registered under a name of its own, run in the caller while the fixture holds."""
    calls: list[tuple] = []

    @current_app.task(name="tests.queue.echo")
    def echo(*args):
        calls.append(args)

    eager = current_app.conf.task_always_eager
    current_app.conf.task_always_eager = True
    yield calls
    current_app.conf.task_always_eager = eager
    current_app.tasks.unregister("tests.queue.echo")


def test_a_send_by_name_runs_that_task_with_its_arguments(eager_echo):
    task_send("tests.queue.echo", 7, "x")
    assert eager_echo == [(7, "x")]
