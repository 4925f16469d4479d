"""The lower bound for a search: the same sandboxed commands, in the same rounds, with no framework.

    .venv/bin/python bench/bare_loop.py [--population 32] [--sleep 0.2] [--trials 3] [--keep]

What it runs, mirroring how Crucible runs a search (search_app/services/, execution.py) for the
specs bench/search_orchestration.py writes (writer `echo $CRUCIBLE_CANDIDATE_ID > code/id.txt`, one
gate `sleep S` or `true`, a score command printing a cksum, optionally each after `sleep S`):

- **Round 0** on a `ThreadPoolExecutor(16)`: per candidate one chain — `git worktree add --detach`,
  the writer in bubblewrap, `git diff` for its patch, `git worktree remove`; then its evaluation:
  `git worktree add --detach`, `git apply`, the gate in bubblewrap, `git worktree remove`. The
  baseline's evaluation (worktree, gate, remove) is one more chain, as Crucible's baseline step is.
- **Each round's trials**, after a barrier (every chain of the round has ended): one evaluation
  tree per member (the round's survivors and the baseline: worktree add and apply), then `trials`
  blocks in which every member runs the score command once, one at a time in a seeded order, then
  the trees are removed. Crucible's `measure` step runs them so: trials are timed in an exclusive
  lane, never beside another command. Survivors are the members whose median beats the
  baseline's, best first, cut to the next round's size (Crucible's `absolute` comparison, which the
  bench's specs use so both sides run exactly `trials` blocks).
- **Replay** of the winner: a fresh tree and its gate, then `trials` blocks of it and the baseline.
- **Review**: Crucible's static reviewer (search_app/reviewer.py) reads the patch in bubblewrap,
  the tree bound read-only, as Crucible's review step runs it for a command worker.

Differences, all in the bare loop's favour (it is the lower bound): bubblewrap is plain
(`--ro-bind / /`, the worktree bound writable, `--unshare-all`, no uid change, no rlimits, no
cgroup, no fresh overlay per command, no hidden files, no change policy); a candidate's evaluation
starts as soon as its own writer ends (Crucible admits evaluations in candidate order). It adds
and removes worktrees of one repository one at a time (concurrent `git worktree add`s fail here;
Crucible's runtime_app.worktrees.repo_lock serialises its adds too), and makes the trees of a
round's trials one after another, as Crucible's single `measure` step does. There is no database,
no receipt and no lease. It runs the same commands as Crucible's receipts record (writers, gates,
trials, the review); bench/search_orchestration.py prints both counts side by side.

With `--sandbox crucible` every command runs in Crucible's own sandbox instead
(runtime_app.sandbox.run, as the steps call it: an unprivileged uid, the allow-list view, rlimits
and cgroups; gates and trials on a fresh overlay, trials in the exclusive lane with a metrics
file): still no database, receipt or planner, so the difference from the plain run is what the
sandbox alone costs, and the difference from Crucible is what the orchestration costs.

It prints the wall time, the commands run and their total time, and the git processes started.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from _search_setup import REPO_ROOT, bench_temp, django_setup

CONCURRENCY = 16
REVIEWER = REPO_ROOT / "search_app" / "reviewer.py"
GIT_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@crucible.invalid",
           "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@crucible.invalid",
           # Crucible's sandbox hands a writer's tree to its unprivileged uid, as Crucible's git does.
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}


@dataclass
class Timed:
    """One sandboxed command: the barrier segment (`phase`) and chain it belongs to, its seconds,
    and when it started (seconds since the search started)."""

    phase: str
    chain: str
    seconds: float
    started: float = 0.0


@dataclass
class BareResult:
    wall: float
    winner: str
    commands: list[Timed] = field(default_factory=list)
    git_processes: int = 0

    @property
    def command_seconds(self) -> float:
        return sum(c.seconds for c in self.commands)


def round_aware_ideal(commands: list[Timed], concurrency: int = CONCURRENCY
                      ) -> tuple[float, dict[str, float]]:
    """Σ over barrier segments of max(the segment's command time / concurrency, its longest chain):
    the wall time of a perfect scheduler that keeps the same barriers and the same serial chains."""
    phases: dict[str, dict[str, float]] = {}
    for command in commands:
        chains = phases.setdefault(command.phase, {})
        chains[command.chain] = chains.get(command.chain, 0.0) + command.seconds
    ideal = {phase: max(sum(chains.values()) / concurrency, max(chains.values()))
             for phase, chains in phases.items()}
    return sum(ideal.values()), ideal


def segment_spans(commands: list[Timed]) -> dict[str, float]:
    """Each barrier segment's wall time: from its first command's start to its last one's end."""
    spans: dict[str, list[float]] = {}
    for command in commands:
        span = spans.setdefault(command.phase, [command.started, command.started + command.seconds])
        span[0] = min(span[0], command.started)
        span[1] = max(span[1], command.started + command.seconds)
    return {phase: end - start for phase, (start, end) in spans.items()}


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class BareLoop:
    """One search's commands, run directly: git and bubblewrap, a thread pool, and barriers."""

    def __init__(self, repo: Path, work: Path, population: int, rounds: list[int], sleep: float, trials: int,
                 sandbox: str = "bwrap"):
        self.repo, self.work, self.sandbox = repo, work, sandbox
        self.population, self.rounds, self.sleep, self.trials = population, rounds, sleep, trials
        self.pause = f"sleep {sleep}; " if sleep else ""
        self.writer = self.pause + "echo $CRUCIBLE_CANDIDATE_ID > code/id.txt"
        self.gate = f"sleep {sleep}" if sleep else "true"
        self.score = self.pause + "printf '{\"v\": %s}\\n' $(cksum < code/id.txt | cut -d' ' -f1)"
        self.commands: list[Timed] = []
        self.git_processes = 0
        self.lock = threading.Lock()
        self.started = time.perf_counter()  # reset when run() starts
        self.repo_lock = threading.Lock()  # concurrent `git worktree add`s race on .git/worktrees
        self.baseline = self._git(["rev-parse", "HEAD"], repo).decode().strip()

    # ---------------------------------------------------------------------------------- parts

    def _git(self, args: list[str], cwd: Path, stdin: bytes = b"") -> bytes:
        with self.lock:
            self.git_processes += 1
        done = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, input=stdin, capture_output=True,
                              check=False)
        if done.returncode:
            raise RuntimeError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def _sandboxed(self, argv: list[str], tree: Path, phase: str, chain: str, *,
                   env: dict[str, str] | None = None, stdin: bytes = b"", writable: bool = True,
                   kind: str = "writer") -> subprocess.CompletedProcess:
        if self.sandbox == "crucible":
            return self._crucible_sandboxed(argv, tree, phase, chain, env=env, stdin=stdin, writable=writable,
                                            kind=kind)
        bwrap = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                 "--bind" if writable else "--ro-bind", str(tree), str(tree), "--chdir", str(tree),
                 "--unshare-all", "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--clearenv",
                 "--setenv", "PATH", "/usr/bin:/bin"]
        for name, value in (env or {}).items():
            bwrap += ["--setenv", name, value]
        started = time.perf_counter()
        done = subprocess.run([*bwrap, *argv], input=stdin, capture_output=True, check=False)
        seconds = time.perf_counter() - started
        with self.lock:
            self.commands.append(Timed(phase, chain, seconds, started - self.started))
        return done

    def _crucible_sandboxed(self, argv: list[str], tree: Path, phase: str, chain: str, *,
                            env: dict[str, str] | None, stdin: bytes, writable: bool, kind: str
                            ) -> subprocess.CompletedProcess:
        """The command as a search step runs it (search_app/execution.py's options per kind)."""
        # Imported here: the plain mode runs without Django; this one needs it set up first.
        from runtime_app import sandbox
        from runtime_app.lane import EXCLUSIVE, SHARED

        metrics = self.work / f"metrics-{threading.get_ident()}.json" if kind == "trial" else None
        started = time.perf_counter()
        receipt = sandbox.run(argv, cwd=tree, timeout=600, env=env, stdin=stdin, writable=writable,
                              fresh=kind in ("gate", "trial"), lane=EXCLUSIVE if kind == "trial" else SHARED,
                              readable=[self.repo / ".git"], metrics_file=metrics)
        seconds = time.perf_counter() - started
        with self.lock:
            self.commands.append(Timed(phase, chain, seconds, started - self.started))
        return subprocess.CompletedProcess(argv, receipt.exit_code if receipt.exit_code is not None else -1,
                                           receipt.stdout_excerpt.encode(), receipt.stderr_excerpt.encode())

    def _shell(self, command: str, tree: Path, phase: str, chain: str, kind: str = "writer", **env: str
               ) -> subprocess.CompletedProcess:
        return self._sandboxed(["sh", "-c", command], tree, phase, chain, env=env, kind=kind)

    def _tree(self, name: str, patch: bytes) -> Path:
        tree = self.work / name
        with self.repo_lock:
            self._git(["worktree", "add", "--detach", "-q", str(tree), self.baseline], self.repo)
        if patch:
            self._git(["apply", "--whitespace=nowarn", "-"], tree, stdin=patch)
        return tree

    def _remove(self, tree: Path) -> None:
        with self.repo_lock:
            self._git(["worktree", "remove", "--force", str(tree)], self.repo)

    # --------------------------------------------------------------------------------- steps

    def _write_and_gate(self, cid: str) -> tuple[str, bytes | None]:
        """Round 0's chain for one candidate: its writer, its patch, then its evaluation (gates)."""
        phase = "round 0 write+gates"
        tree = self._tree(f"{cid}-write", b"")
        try:
            self._shell(self.writer, tree, phase, cid, CRUCIBLE_CANDIDATE_ID=cid, CRUCIBLE_ROUND="0")
            patch = self._git(["diff", "--binary"], tree)
        finally:
            self._remove(tree)
        if not patch:
            return cid, None
        return cid, patch if self._gated(cid, patch, phase, f"{cid}-evaluate") else None

    def _gated(self, cid: str, patch: bytes, phase: str, name: str) -> bool:
        tree = self._tree(name, patch)
        try:
            return self._shell(self.gate, tree, phase, cid, kind="gate").returncode == 0
        finally:
            self._remove(tree)

    def _measure(self, phase: str, members: dict[str, bytes], namespace: str, chain: str = ""
                 ) -> dict[str, float]:
        """`trials` blocks, every member once per block in a seeded order, one command at a time."""
        trees = {cid: self._tree(f"{cid}-{namespace}", patch) for cid, patch in sorted(members.items())}
        values: dict[str, list[float]] = {cid: [] for cid in members}
        try:
            for block in range(self.trials):
                order = sorted(members)
                random.Random(f"{namespace}-{block}").shuffle(order)
                for cid in order:
                    done = self._shell(self.score, trees[cid], phase, chain or phase, kind="trial")
                    if done.returncode == 0:
                        values[cid].append(float(done.stdout.decode().split()[-1].rstrip("}")))
        finally:
            for tree in trees.values():
                self._remove(tree)
        return {cid: statistics.median(v) for cid, v in values.items() if v}

    # ---------------------------------------------------------------------------------- run

    def run(self) -> BareResult:
        started = self.started = time.perf_counter()
        ids = [f"cand_{n:03d}" for n in range(1, self.population + 1)]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            baseline_gate = pool.submit(self._gated, "baseline", b"", "round 0 write+gates",
                                        "baseline-evaluate")
            patches = {cid: patch for cid, patch in pool.map(self._write_and_gate, ids)
                       if patch is not None}
            baseline_alive = baseline_gate.result()
        # Barrier: every writer and gate of round 0 has ended.
        alive = patches
        for index, _ in enumerate(self.rounds):
            members = {**alive, **({"baseline": b""} if baseline_alive else {})}
            scores = self._measure(f"round {index} trials", members, f"r{index}")
            floor = scores.get("baseline")
            ranked = sorted((cid for cid in alive
                             if cid in scores and (floor is None or scores[cid] > floor)),
                            key=lambda cid: (-scores[cid], cid))
            keep = self.rounds[index + 1] if index + 1 < len(self.rounds) else 1
            alive = {cid: alive[cid] for cid in ranked[:keep]}
            if not alive:
                return BareResult(time.perf_counter() - started, "NONE", self.commands, self.git_processes)
        winner = next(iter(alive))
        # Replay: a clean tree and its gates, then its blocks beside the baseline's; then the review.
        if self._gated(winner, alive[winner], "replay", f"{winner}-replay"):
            self._measure("replay", {winner: alive[winner], "baseline": b""}, "replay", chain=winner)
        tree = self._tree(f"{winner}-review", alive[winner])
        try:
            self._sandboxed([sys.executable, str(REVIEWER), "--protected", "tests"], tree, "review",
                            winner, stdin=alive[winner], writable=False, kind="review")
        finally:
            self._remove(tree)
        return BareResult(time.perf_counter() - started, winner, self.commands, self.git_processes)


def bare_run(repo: Path, work: Path, population: int, rounds: list[int], sleep: float, trials: int,
             sandbox: str = "bwrap") -> BareResult:
    """Run one bare search against `repo` (trees under `work`, removed as it goes); `sandbox` is
    "bwrap" (plain bubblewrap) or "crucible" (runtime_app.sandbox; Django must be set up)."""
    work.mkdir(parents=True, exist_ok=True)
    try:
        return BareLoop(repo, work, population, rounds, sleep, trials, sandbox).run()
    finally:
        subprocess.run(["git", "worktree", "prune"], cwd=repo, env=GIT_ENV, check=False)
        shutil.rmtree(work, ignore_errors=True)


def make_repo(path: Path) -> Path:
    """The benches' repository: code/id.txt ("baseline") and a README, one commit on main."""
    (path / "code").mkdir(parents=True)
    (path / "code" / "id.txt").write_text("baseline\n")
    (path / "README").write_text("bench\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "baseline"]):
        subprocess.run(["git", *args], cwd=path, env=GIT_ENV, check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--rounds", default="",
                        help="comma-separated, e.g. 32,8,3,1 (default: by population)")
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each command sleeps (0: trivial)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--sandbox", choices=("bwrap", "crucible"), default="bwrap",
                        help="plain bubblewrap, or Crucible's own sandbox (runtime_app.sandbox)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    rounds = [int(r) for r in args.rounds.split(",")] if args.rounds else default_rounds(args.population)
    with bench_temp(args.keep) as temp:
        if args.sandbox == "crucible":
            django_setup(temp / "data")
        repo = make_repo(temp / "repo")
        result = bare_run(repo, temp / "trees", args.population, rounds, args.sleep, args.trials,
                          args.sandbox)
    ideal, _ = round_aware_ideal(result.commands)
    kind = f"sleep {args.sleep:g} s" if args.sleep else "trivial"
    print(f"bare loop ({args.sandbox}): population {args.population}, rounds {rounds}, trials {args.trials}, "
          f"commands {kind}: winner {result.winner}")
    print(f"  wall {result.wall:.2f} s; {len(result.commands)} commands, {result.command_seconds:.2f} s "
          f"in all (Σ/16 {result.command_seconds / CONCURRENCY:.2f} s, round-aware ideal {ideal:.2f} s); "
          f"{result.git_processes} git processes")


def default_rounds(population: int) -> list[int]:
    """The benches' narrowing: 32 → 8 → 3 → 1; from 40 on, a tenth, then 2, then 1."""
    if population == 32:
        return [32, 8, 3, 1]
    return [population, max(population // 10, 2), 2, 1] if population >= 40 else [population, 1]


if __name__ == "__main__":
    main()
