"""Shared fixtures: personas, real services (or a clear skip), subprocess helpers.
Plain helpers (login, make_user, subprocess_env, …) live in tests/helpers.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.conf import settings

from runtime_app import access
from runtime_app.models import Project, ProjectMembership
from tests.helpers import (
    REPO_ROOT,
    Personas,
    PublishedSchema,
    free_port,
    make_user,
    service_missing,
    stop_process,
    subprocess_env,
    wait_for_port,
)


@pytest.fixture
def personas(db) -> Personas:
    owner = make_user("owner", can_create_projects=True)
    member = make_user("member", can_create_projects=True)
    outsider = make_user("outsider", can_create_projects=True)
    alpha = Project.objects.create(name="alpha", created_by=owner)
    beta = Project.objects.create(name="beta", created_by=outsider)
    ProjectMembership.objects.create(project=alpha, user=owner, role=access.ADMIN)
    ProjectMembership.objects.create(project=alpha, user=member, role=access.OPERATOR)
    ProjectMembership.objects.create(project=beta, user=outsider, role=access.ADMIN)
    return Personas(owner, member, outsider, alpha, beta)


@pytest.fixture
def approver(personas):
    """A member of project alpha with the approver role (and not its author)."""
    user = make_user("approver")
    ProjectMembership.objects.create(project=personas.alpha, user=user, role=access.APPROVER)
    return user


@pytest.fixture
def redis_url() -> str:
    """A reachable Redis: REDIS_URL, or the local default; skip (or fail in CI) if none."""
    import redis

    url = settings.CONFIG.redis_url or "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.RedisError as error:
        service_missing(f"Redis at {url} is not reachable: {error}")
    return url


@pytest.fixture
def daphne_server(transactional_db) -> Iterator[str]:
    """Daphne serving the app in a subprocess against this test's database; yields its URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "crucible.asgi:application"],
        cwd=REPO_ROOT,
        env=subprocess_env(CRUCIBLE_EVENT_POLL_SECONDS="0.2"),
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    # Personas are made per test; the real hasher's 1M iterations would dominate the suite.
    settings.PASSWORD_HASHERS = ["tests.hashers.FastPBKDF2PasswordHasher"]


# ---- every /api/ response of the suite checked against the published OpenAPI schema


_published_schema: list[PublishedSchema] = []


@pytest.fixture(autouse=True)
def api_responses_match_the_published_schema(monkeypatch) -> None:
    """Fail a test whose test-client call to /api/ answers JSON its published schema rejects."""
    from django.test.client import Client as DjangoClient

    original = DjangoClient.request

    def checked(self, **request):
        response = original(self, **request)
        path = request.get("PATH_INFO", "")
        if (path.startswith("/api/") and not path.startswith(("/api/docs", "/api/openapi"))
                and response.get("Content-Type", "").startswith("application/json")):
            if not _published_schema:
                _published_schema.append(PublishedSchema.load())
            problems = _published_schema[0].problems(request.get("REQUEST_METHOD", "GET"), path, response)
            if problems:
                pytest.fail("the response does not match /api/openapi.json:\n" + "\n".join(problems[:10]))
        return response

    monkeypatch.setattr(DjangoClient, "request", checked)
