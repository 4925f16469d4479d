"""The static reviewer flags code that reaches into the process judging it, by what it reaches,
on the line that reaches it, and approves ordinary speed-ups.

Each patch is a real `git diff` of a real repository, read with the patched tree as the working
directory, as the sandbox runs it. A hostile line is marked `# <-`; the finding must name it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from search_app import reviewer
from tests.gitrepo import git, repo_create, write_files

BASELINE = {
    "code/work.py": "def compute(n):\n    return sum(i * i for i in range(n))\n",
    "tests/test_work.py": "from code.work import compute\n\ndef test_it():\n    assert compute(10) == 285\n",
    "expected_result.json": '{"result": 332833500}\n',
}
GATES = ["python -m pytest -q tests", "python scripts/score.py"]


def _diff(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str]:
    repo = repo_create(tmp_path / "repo", BASELINE)
    write_files(repo, files)
    git(repo, "add", "-A")
    return repo, git(repo, "diff", "--cached", "HEAD") + "\n"


def _review(tmp_path: Path, monkeypatch, files: dict[str, str]) -> dict:
    repo, patch = _diff(tmp_path, files)
    monkeypatch.chdir(repo)
    return reviewer.review(patch, ["tests", "expected_result.json"], GATES)


def _marked(source: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if "# <-" in line)


# Each written as an attacker would, in a module the tests import.
HOSTILE = {
    "the test runner's plugin manager found through gc": """
        import gc  # <-
        for obj in gc.get_objects():
            if type(obj).__name__ == "Config":
                obj.pluginmanager.register(object())
    """,
    "the test runner's internals imported": """
        from _pytest.config import Config  # <-
    """,
    "pluggy's marker": """
        import pluggy  # <-
        mark = pluggy.HookimplMarker("pytest")
    """,
    "a hook function in an imported module": """
        def compute(n):
            return 0

        def pytest_sessionfinish(session, exitstatus):  # <-
            session.exitstatus = 0
    """,
    "a hook marked by pluggy's attribute, with an innocent name": """
        def finish(self, session):
            session.exitstatus = 0
        finish.pytest_impl = {"specname": "x"}  # <-
    """,
    "unittest's load_tests protocol": """
        def load_tests(loader, tests, pattern):  # <-
            return tests
    """,
    "a tracer": """
        import sys
        sys.settrace(lambda *a: None)  # <-
    """,
    "a thread tracer": """
        import threading
        threading.settrace(print)  # <-
    """,
    "an audit hook": """
        import sys
        sys.addaudithook(lambda event, args: None)  # <-
    """,
    "an excepthook": """
        import sys
        sys.excepthook = lambda *a: None  # <-
    """,
    "the caller's frame": """
        import sys
        sys._getframe(1).f_globals["passed"] = True  # <-
    """,
    "inspect's frames": """
        from inspect import currentframe as here  # <-
    """,
    "a frame through a caught exception": """
        try:
            raise ValueError
        except ValueError as error:
            caller = error.__traceback__.tb_frame.f_back  # <-
    """,
    "a generator's frame": """
        def g():
            yield
        frame = g().gi_frame  # <-
    """,
    "sys.modules": """
        import sys
        runner = sys.modules["_pytest.main"]  # <-
    """,
    "every class through the object model": """
        classes = ().__class__.__base__.__subclasses__()  # <-
    """,
    "a function's globals": """
        def compute(n):
            return 0
        sys_module = compute.__globals__["__builtins__"]  # <-
    """,
    "a closure cell": """
        def outer():
            x = 1
            return lambda: x
        value = outer().__closure__[0].cell_contents  # <-
    """,
    "a code object": """
        def compute(n):
            return 0
        compute.__code__ = (lambda n: 1).__code__  # <-
    """,
    "an obfuscated import of gc": """
        m = __import__("g" + "c")  # <-
    """,
    "an import by bytes": """
        m = __import__(bytes([103, 99]).decode())  # <-
    """,
    "a frame getter built from strings": """
        import sys
        f = getattr(sys, "_get" + "frame")  # <-
    """,
    "importlib with a computed name": """
        import importlib  # <-
        name = "g" + "c"
        module = importlib.import_module(name)
    """,
    "the builtin getattr passed around": """
        get = getattr  # <-
    """,
    "globals() written": """
        globals()["compute"] = lambda n: 0  # <-
    """,
    "a module's namespace through vars()": """
        import time
        vars(time)["perf_counter"] = lambda: 0.0  # <-
    """,
    "eval": """
        compute = eval("lambda n: 0")  # <-
    """,
    "exec": """
        exec("import gc")  # <-
    """,
    "compile": """
        code = compile("1", "x", "eval")  # <-
    """,
    "attrgetter with a dunder": """
        import operator
        grab = operator.attrgetter("__globals__")  # <-
    """,
    "os._exit at import": """
        import os
        os._exit(0)  # <-
    """,
    "sys.exit at import": """
        import sys
        sys.exit(0)  # <-
    """,
    "raise SystemExit": """
        def compute(n):
            raise SystemExit(0)  # <-
    """,
    "a SystemExit in disguise": """
        class Done(SystemExit):  # <-
            pass
    """,
    "exit()": """
        exit()  # <-
    """,
    "atexit": """
        import atexit  # <-
        atexit.register(lambda: None)
    """,
    "a signal handler": """
        import signal  # <-
        signal.signal(signal.SIGTERM, lambda *a: None)
    """,
    "killing the parent": """
        import os
        os.kill(os.getppid(), 9)  # <-
    """,
    "a frozen clock": """
        import time
        time.perf_counter = lambda: 0.0  # <-
    """,
    "a clock frozen with setattr": """
        import time
        setattr(time, "process_time", lambda: 0.0)  # <-
    """,
    "print replaced for everyone": """
        import builtins  # <-
        builtins.print = lambda *a, **k: None
    """,
    "__builtins__": """
        __builtins__["len"] = lambda x: 0  # <-
    """,
    "stdout replaced": """
        import io
        import sys
        sys.stdout = io.StringIO()  # <-
    """,
    "a library object patched": """
        import json
        json.dumps = lambda *a, **k: "{}"  # <-
    """,
    "the environment": """
        import os
        FAST = os.environ.get("CRUCIBLE_CANDIDATE_ID")  # <-
    """,
    "getenv": """
        from os import getenv  # <-
    """,
    "argv": """
        import sys
        TIMED = "score" in " ".join(sys.argv)  # <-
    """,
    "orig_argv": """
        import sys
        TIMED = "-c" not in sys.orig_argv  # <-
    """,
    "interpreter flags": """
        import sys
        TIMED = sys.flags.optimize  # <-
    """,
    "the executable": """
        import sys
        where = sys.executable  # <-
    """,
    "the working directory": """
        import os
        TIMED = os.getcwd().endswith("score")  # <-
    """,
    "the main module": """
        import __main__  # <-
    """,
    "the parent process": """
        import os
        parent = os.getppid()  # <-
    """,
    "/proc": """
        with open("/proc/self/cmdline") as f:  # <-
            TIMED = b"pytest" not in f.read().encode()
    """,
    "a CPU clock": """
        import time
        def compute(n):
            if time.process_time() > 0.05:  # <-
                return 0
            return n
    """,
    "resource use": """
        import resource  # <-
        used = resource.getrusage(resource.RUSAGE_SELF)
    """,
    "the network": """
        import socket  # <-
    """,
    "another program": """
        import subprocess  # <-
        subprocess.run(["true"])
    """,
    "pytest.skip": """
        import pytest  # <-
        pytest.skip("fast")
    """,
    "sys reached through another module": """
        import os
        frame = os.sys._getframe(1)  # <-
    """,
    "sys re-exported under a private name": """
        import collections
        loaded = collections._sys.modules  # <-
    """,
    "a module held in a variable": """
        import typing
        s = typing.sys  # <-
        frame = s._getframe(1)
    """,
    "os held in a variable": """
        import os
        o = os  # <-
        o._exit(0)
    """,
    "sys imported from os": """
        from os import sys as s
        s.exit(0)  # <-
    """,
    "the environment beneath os": """
        import posix
        FAST = posix.environ  # <-
    """,
    "a clock under another name": """
        import timeit  # <-
        started = timeit.default_timer()
    """,
    "an attribute reached through a format string": """
        import string
        got = string.Formatter().get_field("0.__globals__", (len,), {})  # <-
    """,
    "a hook name built from strings": """
        def finish(self, session):
            session.exitstatus = 0
        Quiet = type("Quiet", (), {"pytest" + "_sessionfinish": finish})  # <-
    """,
    "a hook name joined": """
        name = "".join(["pytest", "_runtest_", "makereport"])  # <-
    """,
    "a /proc path built from pieces": """
        status = open("/pr" + "oc/self/status").read()  # <-
    """,
    "objects loaded from bytes": """
        import pickle
        value = pickle.loads(b"...")  # <-
    """,
    "the protected tests imported": """
        import test_work  # <-
    """,
    "the protected tests patched": """
        from tests import test_work  # <-
        test_work.test_it = lambda: None
    """,
    "looking for the judge's files": """
        import os
        CHECKED = os.path.exists(os.path.join("tests", "test_work.py"))  # <-
    """,
    "a source encoding that hides code": """
        # -*- coding: utf-7 -*-  # <-
        def compute(n):
            return 0  # +AAo-import gc
    """,
    "a file that does not parse": """
        def compute(n):
            return n +  # <-
    """,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_way_of_reaching_into_the_judge_is_rejected_on_its_line(name, tmp_path, monkeypatch):
    source = textwrap.dedent(HOSTILE[name]).lstrip("\n")
    result = _review(tmp_path, monkeypatch, {"code/work.py": source})
    assert result["verdict"] == "reject", (name, result)
    high = [f for f in result["findings"] if f["severity"] == "high"]
    assert high and high[0]["path"] == "code/work.py", result
    assert _marked(source) in {f["line"] for f in high}, (name, result)


HONEST = {
    "a sieve": """
        from math import isqrt


        def compute(n):
            sieve = bytearray([1]) * n
            sieve[0:2] = b"\\x00\\x00"
            for i in range(2, isqrt(n - 1) + 1):
                if sieve[i]:
                    sieve[i * i::i] = bytes(len(range(i * i, n, i)))
            return sum(sieve)
    """,
    "memoisation": """
        import functools
        import sys

        sys.setrecursionlimit(10_000)


        @functools.lru_cache(maxsize=None)
        def compute(n):
            return 0 if n == 0 else compute(n - 1) + (n - 1) * (n - 1)
    """,
    "vectorising without numpy": """
        import operator
        from itertools import accumulate, repeat


        def compute(n):
            r = range(n)
            return sum(map(operator.mul, r, r))


        def prefix(values):
            return list(accumulate(values))


        def ones(n):
            return list(repeat(1, n))
    """,
    "a closed form and a lookup": """
        from bisect import bisect_left
        from collections import Counter
        from functools import cache


        @cache
        def compute(n):
            return (n - 1) * n * (2 * n - 1) // 6


        def rank(values, x):
            return bisect_left(sorted(values), x)


        def common(words):
            return Counter(words).most_common(1)
    """,
    "numpy": """
        import numpy as np


        def compute(n):
            r = np.arange(n, dtype=np.int64)
            return int(np.dot(r, r))
    """,
    "a package of the repository named like a standard module": """
        from code.helpers import square  # code/ is the repository's package here


        def compute(n):
            return sum(map(square, range(n)))
    """,
    "a small class and a main block": """
        import sys
        from dataclasses import dataclass

        input = sys.stdin.readline


        @dataclass
        class Point:
            __slots__ = ("x", "y")
            x: int
            y: int

            def __repr__(self):
                return f"{self.__class__.__name__}({self.x}, {self.y})"


        def compute(n):
            return sum([i * i for i in range(n)])


        if __name__ == "__main__":
            sys.stdout.write(str(compute(10)) + "\\n")
    """,
}


@pytest.mark.parametrize("name", list(HONEST))
def test_an_honest_speed_up_is_approved(name, tmp_path, monkeypatch):
    source = textwrap.dedent(HONEST[name]).lstrip("\n")
    files = {"code/work.py": source}
    if name.startswith("a package of the repository"):
        files.update({"code/__init__.py": "", "code/helpers.py": "def square(x):\n    return x * x\n"})
    result = _review(tmp_path, monkeypatch, files)
    assert result["verdict"] == "approve", (name, result)
    assert not [f for f in result["findings"] if f["severity"] == "high"], result


def test_setrecursionlimit_and_the_processs_own_streams_are_not_the_judge(tmp_path, monkeypatch):
    source = ("import sys\nsys.setrecursionlimit(100000)\ndata = sys.stdin.buffer.read()\n"
              "sys.stdout.write('x')\nsys.stdout.flush()\nbig = sys.maxsize\n")
    result = _review(tmp_path, monkeypatch, {"code/work.py": source})
    assert result == {"verdict": "approve", "findings": []}


def test_rebinding_a_builtin_in_its_own_module_is_advice_not_a_reject(tmp_path, monkeypatch):
    source = "def print(*args):\n    pass\n\nprint = print\n"
    result = _review(tmp_path, monkeypatch, {"code/work.py": source})
    assert result["verdict"] == "approve"
    assert [(f["line"], f["severity"]) for f in result["findings"]] == [(4, "medium")]


def test_only_what_the_patch_adds_is_read_and_a_changed_function_is_read_whole(tmp_path, monkeypatch):
    repo = repo_create(tmp_path / "repo", {
        "code/work.py": ("import os\nDEBUG = os.environ.get('DEBUG')\n\n\n"
                         "def compute(n):\n    if os.environ.get('TRACE'):\n        pass\n"
                         "    return sum(i * i for i in range(n))\n\n\n"
                         "def other():\n    return 1\n"),
    })
    # Changing other() leaves the environment reads, which the baseline already had, unread.
    (repo / "code/work.py").write_text((repo / "code/work.py").read_text().replace("return 1", "return 2"))
    patch = git(repo, "diff") + "\n"
    monkeypatch.chdir(repo)
    assert reviewer.review(patch, [], GATES) == {"verdict": "approve", "findings": []}
    # Changing compute() reads all of it: an unchanged line of a changed function still counts.
    git(repo, "checkout", "--", ".")
    (repo / "code/work.py").write_text((repo / "code/work.py").read_text().replace(
        "        pass\n", "        return 0\n"))
    result = reviewer.review(git(repo, "diff") + "\n", [], GATES)
    assert result["verdict"] == "reject"
    assert [(f["line"], f["severity"]) for f in result["findings"]] == [(6, "high")]
    assert "unchanged line of a function this patch changes" in result["findings"][0]["message"]


def test_a_module_of_the_repository_named_like_a_private_one_is_not_the_judge(tmp_path, monkeypatch):
    result = _review(tmp_path, monkeypatch, {"code/_helpers.py": "def square(x):\n    return x * x\n",
                                             "code/work.py": "from _helpers import square\n\n"
                                                             "def compute(n):\n"
                                                             "    return sum(map(square, range(n)))\n"})
    assert result["verdict"] == "approve", result


def test_the_test_runners_distributions_are_derived_from_the_commands_and_the_installation():
    harness = reviewer.harness_modules(("python -m pytest -q tests",))
    assert {"pytest", "_pytest", "pluggy", "unittest", "doctest"} <= set(harness)
    assert harness["pluggy"] == "pluggy"  # pytest requires it
    assert "json" not in reviewer.harness_modules(("python -m json.tool data.json",))


def test_the_object_models_attributes_are_derived_from_the_interpreters_objects():
    assert {"__globals__", "__code__", "__closure__", "__subclasses__", "__mro__", "__dict__", "f_back",
            "f_globals", "f_locals", "tb_frame", "gi_frame", "cell_contents"} <= reviewer.OBJECT_MODEL
    assert not {"__name__", "__init__", "__class__", "__doc__", "__len__", "replace", "close",
                "args"} & reviewer.OBJECT_MODEL


def test_code_nested_deeper_than_the_reviewer_reads_is_rejected(tmp_path, monkeypatch):
    result = _review(tmp_path, monkeypatch, {"code/work.py": "x = " + "-" * 100_000 + "1\n"})
    assert result["verdict"] == "reject" and result["findings"][0]["line"] == 1


def test_a_shell_script_is_flagged_whole_and_other_text_by_its_lines(tmp_path, monkeypatch):
    result = _review(tmp_path, monkeypatch, {"code/run.sh": "#!/bin/sh\necho fast\n",
                                             "code/notes.txt": "fetch it with curl\n"})
    found = {(f["path"], f["line"], f["severity"]) for f in result["findings"]}
    assert ("code/run.sh", 1, "high") in found and ("code/notes.txt", 1, "high") in found


def test_copies_of_protected_expected_values_are_still_flagged(tmp_path, monkeypatch):
    result = _review(tmp_path, monkeypatch, {"code/work.py": "def compute(n):\n    return 332833500\n"})
    assert result["verdict"] == "reject"
    assert result["findings"][0]["line"] == 2 and "332833500" in result["findings"][0]["message"]


def test_the_script_reads_the_patch_on_stdin_and_prints_its_verdict_last(tmp_path):
    repo, patch = _diff(tmp_path, {"code/work.py": "import gc\n\ndef compute(n):\n    return 0\n"})
    ran = subprocess.run([sys.executable, "-I", str(reviewer.__file__), "--protected", "tests",
                          "--commands", json.dumps(GATES)],
                         cwd=repo, input=patch.encode(), capture_output=True, check=True)
    lines = ran.stdout.decode().splitlines()
    assert lines[0].startswith("high: code/work.py:1: reaches the interpreter's live objects (gc)")
    assert json.loads(lines[-1])["verdict"] == "reject"
