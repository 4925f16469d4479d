"""Settings at start-up: the data dir and what it holds are private to Crucible's user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT


def manage(data_dir: Path, *args: str) -> None:
    """A manage.py command on `data_dir` in the embedded mode, under the usual umask 022."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CRUCIBLE_SECRET_KEY")}
    env["CRUCIBLE_DATA_DIR"] = str(data_dir)
    subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, check=True,
                   capture_output=True, timeout=300, preexec_fn=lambda: os.umask(0o022))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes(data_dir: Path) -> dict[str, int]:
    """The mode of the data dir, its top-level files and everything under broker/."""
    found = {".": mode(data_dir)}
    found |= {p.name: mode(p) for p in data_dir.iterdir() if p.is_file()}
    found |= {str(p.relative_to(data_dir)): mode(p) for p in (data_dir / "broker").rglob("*")}
    return found


def test_a_fresh_data_dir_its_database_and_secret_key_are_private(tmp_path):
    data_dir = tmp_path / "data"
    manage(data_dir, "migrate", "--noinput")
    found = modes(data_dir)
    assert {"crucible.sqlite3", "secret_key", "broker/queue"} <= set(found)
    assert found["."] == 0o700 and found["crucible.sqlite3"] == 0o600 and found["secret_key"] == 0o600
    loose = {name: oct(m) for name, m in found.items() if name != "." and m & 0o077}
    assert loose == {}


def test_an_older_install_left_readable_by_others_is_tightened_at_start_up(tmp_path):
    data_dir = tmp_path / "data"
    manage(data_dir, "migrate", "--noinput")
    message = data_dir / "broker" / "queue" / "1_msg.msg"
    message.write_text("{}")
    extra = [data_dir / name for name in ("crucible.sqlite3-wal", "crucible.sqlite3-shm", "egress.key")]
    for path in extra:
        path.write_bytes(b"")
    for path in [data_dir, *data_dir.iterdir(), *(data_dir / "broker").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (data_dir / "static").chmod(0o755)
    manage(data_dir, "check")
    found = modes(data_dir)
    assert found["."] == 0o700 and found["broker/queue"] == 0o700 and found["broker/queue/1_msg.msg"] == 0o600
    assert all(found[path.name] == 0o600 for path in extra)
    assert {name: oct(m) for name, m in found.items() if name != "." and m & 0o077} == {}
