"""Settings come from the environment; a wrong variable stops start-up with one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crucible.config import KNOWN_NAMES, ConfigError, load
from tests.helpers import REPO_ROOT

STRONG_KEY = "k3y-" + "x7Qp9LmZ2vR8tY4wB6nJ1cF5hD0gS3aE" * 2


def test_defaults_give_the_embedded_mode():
    config = load({})
    assert config.database_url is None and config.redis_url is None
    assert config.event_poll_seconds == 0.5
    assert config.allowed_hosts == ["127.0.0.1", "localhost"]
    assert config.data_dir.name == "var"
    assert config.sandbox == "preferred"
    assert config.read_roots == [] and config.evaluator_roots == []


def test_redis_url_switches_to_slower_safety_polling():
    assert load({"REDIS_URL": "redis://127.0.0.1:6379/0"}).event_poll_seconds == 5.0


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"CRUCIBLE_DEBUG": "maybe"}, "CRUCIBLE_DEBUG"),
        ({"CRUCIBLE_PORT": "eighty"}, "CRUCIBLE_PORT"),
        ({"CRUCIBLE_PORT": "70000"}, "CRUCIBLE_PORT"),
        ({"DATABASE_URL": "mysql://db/crucible"}, "DATABASE_URL"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"CRUCIBLE_SECRET_KEY": "short"}, "CRUCIBLE_SECRET_KEY"),
        ({"CRUCIBLE_EVENT_POLL_SECONDS": "0"}, "CRUCIBLE_EVENT_POLL_SECONDS"),
        ({"CRUCIBLE_LOG_LEVEL": "LOUD"}, "CRUCIBLE_LOG_LEVEL"),
        ({"CRUCIBLE_SANDBOX": "sometimes"}, "CRUCIBLE_SANDBOX"),
        ({"CRUCIBLE_READ_ROOTS": "/srv/bench,relative/tools"}, "CRUCIBLE_READ_ROOTS"),
        ({"CRUCIBLE_EVALUATOR_ROOTS": "hidden"}, "CRUCIBLE_EVALUATOR_ROOTS"),
        ({"CRUCIBLE_CSRF_TRUSTED_ORIGINS": "crucible.example"}, "CRUCIBLE_CSRF_TRUSTED_ORIGINS"),
        ({"CRUCIBLE_ALLOWED_EXTENSIONS": "mypkg.Engine,/srv/x.py"}, "CRUCIBLE_ALLOWED_EXTENSIONS"),
        ({"CRUCIBLE_GIT_URL": "web.internal:8000"}, "CRUCIBLE_GIT_URL"),
        ({"CRUCIBLE_GIT_URL": "http://user:secret@web.internal:8000"}, "CRUCIBLE_GIT_URL"),
    ],
)
def test_a_malformed_variable_is_refused_by_name(environ, named):
    with pytest.raises(ConfigError, match=named):
        load(environ)


def test_allowed_extensions_are_exact_dotted_paths_and_none_by_default():
    assert load({}).allowed_extensions == ()
    loaded = load({"CRUCIBLE_ALLOWED_EXTENSIONS": " mypkg.engines.Mine, mypkg.bench:make ,"})
    assert loaded.allowed_extensions == ("mypkg.engines.Mine", "mypkg.bench:make")


def test_an_unknown_crucible_variable_is_refused_with_a_suggestion():
    expected = "CRUCIBLE_DATA_DIRR is not a Crucible setting; did you mean CRUCIBLE_DATA_DIR"
    with pytest.raises(ConfigError, match=expected):
        load({"CRUCIBLE_DATA_DIRR": "/tmp/x"})


def test_the_benches_redis_url_is_a_known_setting():
    """bench/event_latency.py and bench/ws_fanout.py run with it set; start-up must not refuse it."""
    load({"CRUCIBLE_BENCH_REDIS_URL": "redis://127.0.0.1:6390/9"})
    assert "CRUCIBLE_BENCH_REDIS_URL" in KNOWN_NAMES


def _manage(args: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "CRUCIBLE_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120,
    )


def test_start_up_fails_with_one_line_naming_the_variable(tmp_path):
    result = _manage(["check"], tmp_path, CRUCIBLE_WORKER_CONCURRENCY="lots")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "CRUCIBLE_WORKER_CONCURRENCY" in lines[0]
    assert "Traceback" not in result.stderr


def test_production_settings_pass_the_deploy_check(tmp_path):
    result = _manage(
        ["check", "--deploy", "--fail-level", "WARNING"], tmp_path,
        CRUCIBLE_SECRET_KEY=STRONG_KEY,
        CRUCIBLE_ALLOWED_HOSTS="crucible.example.com",
        CRUCIBLE_HTTPS="true",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_deploy_check_fails_without_https(tmp_path):
    result = _manage(
        ["check", "--deploy", "--fail-level", "WARNING"], tmp_path,
        CRUCIBLE_SECRET_KEY=STRONG_KEY, CRUCIBLE_ALLOWED_HOSTS="crucible.example.com",
    )
    assert result.returncode != 0
    assert "SECURE_SSL_REDIRECT" in result.stdout + result.stderr


def test_a_worker_started_directly_also_fails_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "crucible", "worker"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "CRUCIBLE_DATA_DIR": str(tmp_path), "REDIS_URL": "redis:/oops"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "crucible: configuration error: REDIS_URL='redis:/oops' names no host"
    ]
