"""The candidate page of a 10 MB patch: cut (the first part and a download link) against whole,
measured side by side in one run.

    .venv/bin/python bench/big_patch_page.py [--requests 5] [--megabytes 10]

What it times: a GET of `/searches/<search_id>/candidates/cand_001/` through Django's test
Client logged in as a superuser (routing, middleware, the view, the template), in this process,
with no network; and the size of the response.

How: a temp data dir with a fresh SQLite database; a search frozen against a tiny real git
repository; a candidate row whose patch adds one text file of about 10 MB (200,000 lines of 50
bytes, a valid git diff). "cut" is the page as it is: at most PAGE_PATCH_MAX_BYTES and
PAGE_PATCH_MAX_LINES of the patch, with a note and a link to the full patch. "whole" is the same
page with both limits lifted, which is what every candidate page did before (the whole patch,
twice: the no-JavaScript text and diff2html's JSON). Each is requested once to warm up, then
REQUESTS times, alternating; it prints the median and min of each, the response sizes and the
ratios whole/cut.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _search_setup import bench_temp, django_setup, operator_and_project
from search_orchestration import make_repo, spec

CONTROLLED = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "CRUCIBLE_DATA_DIR",
              "CRUCIBLE_DEBUG", "CRUCIBLE_ALLOWED_HOSTS")


def big_patch(megabytes: float) -> bytes:
    lines = int(megabytes * 1_000_000 / 51)
    body = "".join(f"+{f'row {n}: a generated line of a large data file':<49}\n" for n in range(lines))
    return (f"diff --git a/code/table.txt b/code/table.txt\nnew file mode 100644\n--- /dev/null\n"
            f"+++ b/code/table.txt\n@@ -0,0 +1,{lines} @@\n{body}").encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--megabytes", type=float, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    for name in CONTROLLED:
        os.environ.pop(name, None)
    with bench_temp(args.keep) as temp:
        django_setup(Path(temp) / "data")
        from django.test import Client

        from search_app import services, views
        from search_app.models import Candidate

        user, project = operator_and_project()
        repo = make_repo(Path(temp) / "repo")
        text = spec("big-patch", 16, [16, 1], sleep=0, trials=1)
        search = services.search_freeze(user, project, text, "HEAD", repository_path=str(repo))
        patch = big_patch(args.megabytes)
        Candidate.objects.create(search=search, candidate_id="cand_001", number=1, batch=0,
                                 state="eliminated", patch=patch,
                                 patch_sha256=hashlib.sha256(patch).hexdigest(),
                                 diff_lines=patch.count(b"\n+") - 1, files=["code/table.txt"],
                                 reason="round 0: score 2 is not better than the baseline's 2")
        url = f"/searches/{search.search_id}/candidates/cand_001/"
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        limits = {"cut": (views.PAGE_PATCH_MAX_BYTES, views.PAGE_PATCH_MAX_LINES),
                  "whole": (sys.maxsize, sys.maxsize)}

        def get(mode: str) -> tuple[float, int]:
            views.PAGE_PATCH_MAX_BYTES, views.PAGE_PATCH_MAX_LINES = limits[mode]
            begin = time.perf_counter()
            response = client.get(url)
            elapsed = (time.perf_counter() - begin) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} ({mode}): {response.status_code}")
            return elapsed, len(response.content)

        sizes = {mode: get(mode)[1] for mode in limits}  # warm-up
        times: dict[str, list[float]] = {mode: [] for mode in limits}
        for turn in range(args.requests):
            for mode in (("cut", "whole") if turn % 2 == 0 else ("whole", "cut")):
                times[mode].append(get(mode)[0])

    lines = patch.count(b"\n")
    print(f"Candidate page of a {len(patch) / 1e6:.1f} MB patch ({lines:,} lines), server time per "
          f"GET through the test Client, median of {args.requests} ({os.cpu_count()} cores, Python "
          f"{platform.python_version()}, SQLite)")
    print(f"{'page':<8} {'median ms':>10} {'min ms':>8} {'bytes':>12}")
    median = {mode: statistics.median(values) for mode, values in times.items()}
    for mode in limits:
        print(f"{mode:<8} {median[mode]:>10.1f} {min(times[mode]):>8.1f} {sizes[mode]:>12,}")
    print(f"ratio whole/cut: time {median['whole'] / median['cut']:.1f}×, "
          f"bytes {sizes['whole'] / sizes['cut']:.1f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
