"""Plain helpers shared by the tests (fixtures live in tests/conftest.py): paths, personas' accounts,
subprocesses on the test database, logged-in clients, and the published API schema."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import jsonschema
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.test import Client

from runtime_app.models import Project

REPO_ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")


def service_missing(message: str) -> None:
    """Skip a test whose service is missing, or fail it when CI requires services."""
    if settings.CONFIG.require_services:
        pytest.fail(f"required service missing (CRUCIBLE_REQUIRE_SERVICES=1): {message}")
    pytest.skip(message)


@dataclass
class Personas:
    """owner is project admin of alpha; member is an operator there; outsider is project admin of
    beta only. All three may create projects (as the operators of the global roles before could)."""

    owner: object
    member: object
    outsider: object
    alpha: Project
    beta: Project


def make_user(username: str, *, can_create_projects: bool = False):
    """An account with no role anywhere until a project's membership gives it one."""
    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    if can_create_projects:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="runtime_app",
                                                         codename="add_project"))
    return user


def database_url() -> str:
    """A DATABASE_URL that points a subprocess at the database this test uses."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    return f"postgres://{auth}{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{db['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a Crucible subprocess sharing this test's database."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DJANGO_SETTINGS_MODULE="crucible.settings", DATABASE_URL=database_url())
    env.setdefault("CRUCIBLE_DATA_DIR", str(settings.DATA_DIR))
    env.update(extra)
    return env


def ctrl_c_reaches_it() -> None:
    """preexec_fn: SIGINT as a terminal gives it. A suite started as a background job inherits
    SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before listening")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listened on port {port} within {timeout} s")


def stop_process(process: subprocess.Popen, timeout: float = 15) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def login(user) -> Client:
    """A test client logged in as `user` (no password round trip)."""
    client = Client()
    client.force_login(user)
    return client


def text_of(response) -> str:
    """A response's HTML with entities decoded, for plain-text assertions."""
    return html.unescape(response.content.decode())


@dataclass
class PublishedSchema:
    """/api/openapi.json as published, with each route's path turned into a pattern."""

    document: dict
    routes: list[tuple[re.Pattern, str]]

    @classmethod
    def load(cls) -> PublishedSchema:
        from crucible.api import api

        # The same document /api/openapi.json serves, through JSON as a client reads it.
        document = json.loads(json.dumps(api.get_openapi_schema(path_prefix="/api/"), cls=DjangoJSONEncoder))
        routes = [(re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)) + "$"), path)
                  for path in document["paths"]]
        # A literal segment wins over a parameter (/agents/import before /agents/{agent_id}).
        routes.sort(key=lambda route: route[1].count("{"))
        return cls(document, routes)

    def response_schema(self, method: str, path: str, status: int) -> dict | str | None:
        """The route's JSON schema for `status`; None when the route does not document it (an
        error answer), or a message when the call matches no route at all."""
        operations = [self.document["paths"][template] for pattern, template in self.routes
                      if pattern.match(path) and method.lower() in self.document["paths"][template]]
        if not operations:
            return f"{method} {path} is not in the published schema"
        responses = operations[0][method.lower()]["responses"]
        found = responses.get(str(status)) or responses.get(status)
        if found is None and status < 300:
            return f"{method} {path} answered {status}, which its schema does not list"
        if found is None:
            return None
        return found.get("content", {}).get("application/json", {}).get("schema")

    def problems(self, method: str, path: str, response) -> list[str]:
        schema = self.response_schema(method, path, response.status_code)
        if schema is None:
            return []
        if isinstance(schema, str):
            return [schema]
        validator = jsonschema.Draft202012Validator(
            {**schema, "components": self.document["components"]}
        )
        return [f"{method} {path} ({response.status_code}) at "
                f"{'/'.join(map(str, error.absolute_path)) or '.'}: {error.message}"
                for error in validator.iter_errors(response.json())]
