"""Writers of one process on one WAL SQLite file: SQLite's busy handler against Crucible's
in-process queue (crucible/db/sqlite3).

    .venv/bin/python bench/sqlite_writers.py [--threads 16] [--transactions 50] [--hold-ms 1]

Each thread runs small write transactions (BEGIN IMMEDIATE, one INSERT, `--hold-ms` of Python
work, COMMIT) with the settings Crucible uses (WAL, 30 s busy timeout). For each backend it
prints the wall time, the total time spent waiting to begin a transaction (summed over every
transaction) and that wait's median and worst case. Each backend runs in a subprocess of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BACKENDS = {"busy handler (django.db.backends.sqlite3)": "django.db.backends.sqlite3",
            "in-process queue (crucible.db.sqlite3)": "crucible.db.sqlite3"}


def measure(engine: str, path: Path, threads: int, transactions: int, hold_ms: float) -> dict:
    """Run in a fresh process: the figures of `threads` × `transactions` write transactions."""
    sys.path.insert(0, str(REPO_ROOT))
    from django.conf import settings

    settings.configure(DATABASES={"default": {
        "ENGINE": engine, "NAME": str(path), "CONN_MAX_AGE": 0,
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                                    "PRAGMA busy_timeout=30000;"}}})
    import django

    django.setup()
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS row (id INTEGER PRIMARY KEY, thread INT, n INT)")
    connection.close()
    waits: list[float] = []
    errors: list[str] = []
    start = threading.Barrier(threads)

    def writer(number: int) -> None:
        mine = []
        try:
            start.wait()
            for n in range(transactions):
                began = time.perf_counter()
                atomic = transaction.atomic()
                atomic.__enter__()
                mine.append(time.perf_counter() - began)
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("INSERT INTO row (thread, n) VALUES (%s, %s)", [number, n])
                    time.sleep(hold_ms / 1000)  # the Python work a transaction does while it holds the lock
                finally:
                    atomic.__exit__(None, None, None)
        except Exception as error:  # counted, not hidden: "database is locked" is what this avoids
            errors.append(f"{type(error).__name__}: {error}")
        finally:
            waits.extend(mine)
            connection.close()

    began = time.perf_counter()
    pool = [threading.Thread(target=writer, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    wall = time.perf_counter() - began
    return {"wall": wall, "waited": sum(waits), "median_wait": statistics.median(waits),
            "max_wait": max(waits), "transactions": len(waits), "errors": errors[:3]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--transactions", type=int, default=50)
    parser.add_argument("--hold-ms", type=float, default=1.0)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, path = args.child
        print(json.dumps(measure(engine, Path(path), args.threads, args.transactions, args.hold_ms)))
        return
    print(f"{args.threads} threads × {args.transactions} write transactions, {args.hold_ms:g} ms held each")
    for label, engine in BACKENDS.items():
        path = Path(tempfile.mkdtemp(prefix="crucible-sqlite-writers-")) / "bench.sqlite3"
        out = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--transactions",
                              str(args.transactions), "--hold-ms", str(args.hold_ms), "--child", engine,
                              str(path)], check=True, capture_output=True, text=True,
                             env={**os.environ, "DJANGO_SETTINGS_MODULE": ""})
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{label}: wall {r['wall']:.2f} s; waited {r['waited']:.1f} s in all "
              f"(median {r['median_wait'] * 1000:.1f} ms, max {r['max_wait'] * 1000:.0f} ms each); "
              f"{r['transactions']} transactions, {len(r['errors'])} errors {r['errors'] or ''}")


if __name__ == "__main__":
    main()
