"""`manage.py evolve …`: the CLI door into the same agent and evolution services.

    evolve import PATH [--project demo] [--user admin] [--name N] [--json]
                       [--accept-inferred | --manifest FILE]  a folder without manifest.yaml
    evolve demo [--project demo] [--user admin] [--json]       a fresh copy of the offline demo agent
    evolve run AGENT_ID_OR_PATH [--benchmark demo] [--engine textbook] [--cycles 5]
               [--batch-size N] [--holdout-size N] [--egl-threshold X] [--egl-window N]
               [--review-mode] [--option KEY=VALUE ...] [--options FILE.toml|FILE.json] [--json]
                                                               run here, cycle by cycle, to the end
    evolve status RUN_ID [--json]
    evolve history AGENT_ID [--json]                           version log and score curve
    evolve rollback AGENT_ID evo-K
    evolve cancel RUN_ID

The local administrator's CLI: a PATH is trusted (no CRUCIBLE_REPO_ROOTS check), a path given
to `run` is imported first (or its agent found), and `run` may name engines, benchmarks and agent
classes by dotted path (the web and API only registered ones or CRUCIBLE_ALLOWED_EXTENSIONS).
The engine's options (EvolveConfig.engine_options) come from `--options FILE` (a TOML or JSON
table, by extension) and then `--option KEY=VALUE` (repeatable, winning over the file; a value
reads as true/false, a whole number, a number, or else text); they are checked with the engine
before anything is imported or run.
Exit codes: 0 done (a run that finished or waits for review), 1 refused, a run that failed or was
cancelled, or an error, each reported as one line (an import's workspace problems as one
`file:line: message` line each); 130 when interrupted (the run is cancelled first).

Import copies the folder into Crucible's data dir (its git history too) and imports the copy:
the folder itself is never written; `path` is the copy, `copied from` the folder. Importing a
folder already imported into the project prints its agent and a `note:` line; nothing is copied.
Importing a folder without manifest.yaml prints the manifest Crucible infers on standard output
(so `> m.yaml` saves it to edit) and what a confirmed import would write into the copy on
standard error, and exits 1; `--accept-inferred` imports with it as it is, `--manifest FILE` with
an edited one. What the import found (the inferred manifest and its reasoning, each file
Crucible will not use with the reason) and manifest keys Crucible keeps but does not use are
printed as `warning: ...` lines on standard error (and in --json: `import_warnings`,
`warnings`); they never refuse an import.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.http import Http404
from rich.live import Live
from rich.table import Table

from evolve_app.engines import EngineError, engine_check
from evolve_app.models import Cycle, EvolutionRun
from evolve_app.selectors import (
    agent_for_user,
    agent_import_warnings,
    agent_manifest,
    agent_report,
    agent_summary,
    import_preview,
    run_by_id_for_user,
    run_report,
)
from evolve_app.services import (
    ManifestMissing,
    agent_import,
    agent_rollback,
    demo_agent_create,
    evolution_run_cancel,
    evolution_run_execute,
    evolution_run_start,
)
from evolve_app.workspace import WorkspaceError
from runtime_app.cli import CrucibleCommand, console_for, printable
from runtime_app.presenters import short_sha
from runtime_app.selectors import page_url
from runtime_app.templatetags.crucible_dates import when

_SPARKS = "▁▂▃▄▅▆▇█"


def _score(value: float | None) -> str:
    return "—" if value is None else f"{round(value, 4):g}"


class Command(CrucibleCommand):
    help = "Import agents, evolve them here with a live display, follow, roll back and cancel runs."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True,
                                        metavar="{import,demo,run,status,history,rollback,cancel}")

        def who(sub: Any, *, project: bool = True) -> None:
            if project:
                sub.add_argument("--project", default="demo", help="the project's name (default: demo)")
            sub.add_argument("--user", default=None, help="who acts (default: the admin account)")

        imported = actions.add_parser("import", help="import a workspace folder as an agent")
        imported.add_argument("path", help="the workspace folder (manifest.yaml, prompts/, skills/ …)")
        imported.add_argument("--name", default="", help="the agent's name (default: the manifest's)")
        imported.add_argument("--json", action="store_true", help="print the agent as JSON")
        inferred = imported.add_mutually_exclusive_group()
        inferred.add_argument("--accept-inferred", action="store_true",
                              help="a folder without manifest.yaml: import it with the manifest Crucible "
                                   "infers (shown when this is left out)")
        inferred.add_argument("--manifest", metavar="FILE", default=None,
                              help="a folder without manifest.yaml: import it with this manifest (e.g. the "
                                   "inferred one, edited)")
        who(imported)
        demo = actions.add_parser("demo", help="a fresh copy of the offline demo agent, imported")
        demo.add_argument("--json", action="store_true", help="print the agent as JSON")
        who(demo)
        run = actions.add_parser("run", help="start an evolution run and run it here to its end")
        run.add_argument("agent", metavar="AGENT_ID_OR_PATH", help="an agent's id, or a workspace folder")
        run.add_argument("--benchmark", default="demo",
                         help="a registered name, folder:PATH, jsonl:PATH or a dotted path")
        run.add_argument("--engine", default="textbook", help="an engine name or a dotted path")
        run.add_argument("--cycles", type=int, default=5, help="1 to 200 (default: 5)")
        run.add_argument("--batch-size", type=int, default=None, help="train tasks solved per cycle")
        run.add_argument("--holdout-size", type=int, default=None, help="holdout tasks; 0 turns the gate off")
        run.add_argument("--egl-threshold", type=float, default=None,
                         help="converged when the window's scores differ by less")
        run.add_argument("--egl-window", type=int, default=None, help="cycles in the convergence window")
        run.add_argument("--convergence", choices=("crucible", "a-evolve"), default=None,
                         help="the convergence rule (default: a-evolve for an A-Evolve agent, else crucible)")
        run.add_argument("--trajectory-only", action="store_true",
                         help="the engine sees what the agent did but no score (A-Evolve's trajectory_only)")
        run.add_argument("--evolve-layers", default=None, metavar="LAYER,LAYER",
                         help="only these of the manifest's evolvable layers, e.g. prompts,skills")
        run.add_argument("--review-mode", action="store_true", help="each mutation waits for an approver")
        run.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                         help="an engine option, e.g. --option model=claude-sonnet-4-5 (repeatable; "
                              "true/false, numbers and text are read as such)")
        run.add_argument("--options", default=None, metavar="FILE",
                         help="engine options from a TOML (.toml) or JSON (.json) file; --option wins")
        run.add_argument("--json", action="store_true", help="print the run as JSON, no live display")
        who(run)
        for name, text, arg in (("status", "a run's state and cycles", "run_id"),
                                ("history", "an agent's version log and score curve", "agent_id"),
                                ("cancel", "stop a run", "run_id")):
            sub = actions.add_parser(name, help=text)
            sub.add_argument(arg, type=int, metavar=arg.upper())
            if name != "cancel":
                sub.add_argument("--json", action="store_true", help="print JSON")
            who(sub, project=False)
        rollback = actions.add_parser("rollback", help="make the workspace equal to a snapshot again")
        rollback.add_argument("agent_id", type=int, metavar="AGENT_ID")
        rollback.add_argument("tag", help="the snapshot, e.g. evo-2")
        who(rollback, project=False)

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        self.username = options["user"] or settings.CONFIG.admin_username
        user = self.user_get(self.username)
        if action == "import":
            agent = self._guarded(lambda: self._import(
                user, options["project"], options["path"], options["name"],
                manifest_file=options["manifest"], accept_inferred=options["accept_inferred"],
                as_json=options["json"]))
            self._agent_print(agent, as_json=options["json"])
            self._warnings_print(agent)
        elif action == "demo":
            project = self.project_get(user, options["project"])
            agent = self._guarded(lambda: demo_agent_create(user, project))
            self._agent_print(agent, as_json=options["json"])
        elif action == "run":
            self._run(user, options)
        elif action == "status":
            self._status(self._run_get(user, options["run_id"]), as_json=options["json"])
        elif action == "history":
            self._history(self._agent_get(user, options["agent_id"]), as_json=options["json"])
        elif action == "rollback":
            self._rollback(user, self._agent_get(user, options["agent_id"]), options["tag"])
        else:
            self._cancel(user, self._run_get(user, options["run_id"]))

    # --- helpers --------------------------------------------------------------------------

    def _guarded(self, call: Any) -> Any:
        """The service's answer, or its refusal as one line per message and exit 1."""
        return self.guarded(call, self.username, (WorkspaceError,))

    def _agent_get(self, user: Any, agent_id: int) -> Any:
        try:
            return agent_for_user(user, agent_id)
        except Http404:
            self.fail([f"no agent {agent_id} that {user} can see"])

    def _run_get(self, user: Any, run_id: int) -> Any:
        try:
            return run_by_id_for_user(user, run_id)
        except Http404:
            self.fail([f"no evolution run {run_id} that {user} can see"])

    def _import(self, user: Any, project_name: str, path: str, name: str, *, manifest_file: str | None = None,
                accept_inferred: bool = False, as_json: bool = False) -> Any:
        project = self.project_get(user, project_name)
        manifest = self._manifest_read(manifest_file) if manifest_file else None
        try:
            try:
                return agent_import(user, project, path, name, manifest=manifest, infer=accept_inferred,
                                    trusted=True)
            except ManifestMissing:
                self._preview_print(user, project, path, as_json=as_json)
        except ValidationError as error:
            problems = error.message_dict.get("path", []) if hasattr(error, "error_dict") else []
            if len(problems) > 1 or (manifest is not None and problems):  # each `file:line: message`
                self.fail([*problems, f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''}, "
                            "nothing imported"])
            raise

    def _manifest_read(self, file: str) -> str:
        try:
            with open(file, "rb") as handle:
                data = handle.read(256 * 1024 + 1)
        except OSError as error:
            self.fail([f"{file}: cannot be read ({error.strerror})"])
        if len(data) > 256 * 1024:
            self.fail([f"{file}: larger than 256 KiB; a manifest is a few lines"])
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.fail([f"{file}: not UTF-8 text"])

    def _preview(self, user: Any, project: Any, path: str) -> Any:
        return import_preview(user, project, path, trusted=True)

    def _preview_print(self, user: Any, project: Any, path: str, *, as_json: bool) -> None:
        """The inferred manifest on standard output, the rest on standard error; exit 1."""
        preview = self._preview(user, project, path)
        if as_json:
            self.json_write({"path": preview.path, "manifest": preview.manifest,
                        "prompt_from": preview.prompt_from, "writes": list(preview.writes),
                        "notes": list(preview.notes),
                        "problems": [str(p) for p in preview.problems],
                        "warnings": [str(w) for w in preview.warnings],
                        "unused": [str(u) for u in preview.unused]})
        else:
            self.stdout.write(preview.manifest, ending="")
        lines = [f"{preview.path} has no manifest.yaml; above is the one Crucible infers from its files."]
        lines += [f"note: {note}" for note in preview.notes]
        lines += [f"warning: {warning}" for warning in preview.warnings]
        lines += [f"warning: {entry}" for entry in preview.unused]
        lines += [f"problem: {problem}" for problem in preview.problems]
        lines.append(f"Importing it copies the folder and writes {' and '.join(preview.writes)} into "
                     "Crucible's copy; the folder itself is never written. Nothing was "
                     "imported: run again with --accept-inferred to import with this manifest, or save it "
                     "(evolve import PATH > manifest-draft.yaml), edit it and pass --manifest FILE.")
        self.fail(lines)

    def _warnings_print(self, agent: Any) -> None:
        """On standard error: the note of a folder already imported, or what the import found
        (the manifest it inferred and why, files Crucible will not use), then manifest keys kept
        but not used; one `warning: ...` line each."""
        if agent.import_note:
            self.stderr.write(printable(f"note: {agent.import_note}"), style_func=lambda text: text)
        else:
            for warning in agent_import_warnings(agent):
                self.stderr.write(printable(f"warning: {warning}"), style_func=lambda text: text)
        for warning in agent_manifest(agent)["manifest_warnings"]:
            self.stderr.write(printable(f"warning: {warning}"), style_func=lambda text: text)

    def _agent_print(self, agent: Any, *, as_json: bool) -> None:
        if as_json:
            self.json_write({**agent_summary(agent), "note": agent.import_note,
                             "warnings": [str(w) for w in agent_manifest(agent)["manifest_warnings"]]})
            return
        rows = [("agent id", agent.pk), ("name", agent.name), ("project", agent.project.name),
                ("path", agent.path)]
        if agent.source_path:
            rows.append(("copied from", f"{agent.source_path} (never written)"))
        for label, value in rows:
            self.stdout.write(printable(f"{label:<9} {value}"))

    # --- run ------------------------------------------------------------------------------

    def _run(self, user: Any, options: dict[str, Any]) -> None:
        engine_options = self._engine_options(options["options"], options["option"])
        target = options["agent"]
        if not target.isdigit():  # checked before a folder is imported (evolution_run_start checks again)
            try:
                engine_check(options["engine"], engine_options, trusted=True)
            except EngineError as error:
                self.fail([f"engine: {error}"])
        if target.isdigit():
            agent = self._agent_get(user, int(target))
        else:
            agent = self._guarded(lambda: self._import(user, options["project"], target, ""))
        config = {key: options[key] for key in ("batch_size", "holdout_size", "egl_threshold", "egl_window",
                                                "convergence") if options[key] is not None}
        for flag in ("review_mode", "trajectory_only"):
            if options[flag]:
                config[flag] = True
        if options["evolve_layers"] is not None:
            layers = options["evolve_layers"].split(",")
            config["evolve_layers"] = [layer.strip() for layer in layers if layer.strip()]
        if engine_options:
            config["engine_options"] = engine_options
        run = self._guarded(lambda: evolution_run_start(
            user, agent, benchmark=options["benchmark"], engine=options["engine"], cycles=options["cycles"],
            config=config, enqueue=False, trusted=True))
        url = page_url(run.get_absolute_url())
        # With --json, standard output stays one JSON document.
        (self.stderr if options["json"] else self.stdout).write(
            printable(f"Started run {run.number} of {agent.name} (id {run.pk}): {url}"),
            style_func=lambda text: text)
        run = self._execute(user, run, as_json=options["json"])
        if options["json"]:
            self.json_write(run_report(run))
        self._run_end(run)

    def _engine_options(self, file: str | None, pairs: list[str]) -> dict[str, Any]:
        """--options FILE, then each --option KEY=VALUE over it; a bad one is exit 1 with its
        place (`file:line:column: message` for a file that does not parse)."""
        options: dict[str, Any] = {}
        if file:
            options.update(_options_file(file, self.fail))
        for pair in pairs:
            key, equals, value = pair.partition("=")
            if not equals or not key.strip():
                self.fail([f"--option {pair!r}: give KEY=VALUE, e.g. --option model=claude-sonnet-4-5"])
            options[key.strip()] = option_value(value)
        return options

    def _execute(self, user: Any, run: Any, *, as_json: bool) -> Any:
        """Execute the run in a worker thread while this one shows each cycle as it is recorded
        (a live table on a terminal, one line per cycle otherwise; nothing for --json), then the
        final table. Ctrl-C cancels the run, which stops between cycles, never inside one."""
        console = console_for(self.stdout._out)
        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["run"] = evolution_run_execute(run.pk)
            except BaseException as error:  # reported by the main thread
                outcome["error"] = error
            finally:
                connection.close()

        if not as_json:
            plural = "s" if run.cycles_planned != 1 else ""
            console.print(printable(f"{run.agent.name} run {run.number}: {run.engine} on {run.benchmark}, "
                                     f"{run.cycles_planned} cycle{plural}"), markup=False)
        worker = threading.Thread(target=work, name=f"evolution-run-{run.pk}", daemon=True)
        started = time.monotonic()
        worker.start()
        shown: set[int] = set()
        live = None
        if console.is_terminal and not as_json:
            live = Live(console=console, refresh_per_second=4, transient=True)
            live.start()
        try:
            while True:
                alive = worker.is_alive()
                if not as_json:
                    cycles = list(Cycle.objects.filter(run_id=run.pk).order_by("number"))
                    if live is not None:
                        live.update(_live_view(run, cycles, time.monotonic() - started))
                    for cycle in cycles if live is None else ():
                        if cycle.number not in shown and cycle.status not in ("solving", "evolving"):
                            shown.add(cycle.number)
                            console.print(printable(_cycle_line(cycle)), highlight=False, markup=False)
                if not alive:
                    break
                worker.join(0.25)
        except KeyboardInterrupt:
            if live is not None:
                live.stop()
                live = None
            self._interrupted(user, run, worker)
        finally:
            if live is not None:
                live.stop()
        if "error" in outcome:
            self.fail([f"run {run.number} stopped: {type(outcome['error']).__name__}: {outcome['error']}"])
        run = EvolutionRun.objects.select_related("agent__project", "started_by").get(pk=run.pk)
        if not as_json:
            console.print(_run_table(run, list(Cycle.objects.filter(run=run).select_related("decided_by"))))
        return run

    def _interrupted(self, user: Any, run: Any, worker: threading.Thread) -> None:
        self.stderr.write(f"interrupted: cancelling run {run.number} after its current cycle …")
        with contextlib.suppress(ValidationError, PermissionDenied):  # it ended meanwhile
            evolution_run_cancel(user, run)
        worker.join()
        done = run.cycles.count()
        self.stderr.write(f"run {run.number} cancelled after {done} cycle{'s' if done != 1 else ''}: "
                          f"`manage.py evolve status {run.pk}` shows them")
        raise SystemExit(130)

    def _run_end(self, run: Any) -> None:
        if run.status in (EvolutionRun.Status.FAILED, EvolutionRun.Status.CANCELLED):
            self.fail([f"run {run.number} {run.status}: {run.reason}"])
        if run.status == EvolutionRun.Status.AWAITING_REVIEW:
            waiting = run.cycles.filter(status=Cycle.Status.AWAITING_REVIEW).order_by("number").first()
            if waiting is not None:
                self.stdout.write(f"cycle {waiting.number} (id {waiting.pk}) awaits an approver: decide "
                                  f"on its page or POST /api/cycles/{waiting.pk}/decide")

    # --- status, history, rollback, cancel ------------------------------------------------

    def _status(self, run: Any, *, as_json: bool) -> None:
        if as_json:
            self.json_write(run_report(run))
            return
        cycles = list(Cycle.objects.filter(run=run).select_related("decided_by").order_by("number"))
        console_for(self.stdout._out).print(_run_table(run, cycles))

    def _history(self, agent: Any, *, as_json: bool) -> None:
        report = agent_report(agent)
        if as_json:
            self.json_write({key: report[key] for key in (
                "id", "name", "path", "versions", "versions_error", "runs", "score_curve")})
            return
        console = console_for(self.stdout._out)
        if report["versions_error"]:
            console.print(printable(f"the version log cannot be read: {report['versions_error']}"),
                          markup=False)
        table = Table(title=printable(f"{agent.name} (agent {agent.pk}): versions"), title_justify="left")
        for column in ("tag", "cycle", "commit", "date", "message"):
            table.add_column(column, overflow="fold")
        for version in report["versions"]:
            table.add_row(version["tag"], str(version["cycle"]), short_sha(version["sha"]),
                          when(version["date"]), printable(version["message"]))
        console.print(table)
        curve = Table(title="score curve", title_justify="left")
        for column in ("run", "status", "scores", "curve"):
            curve.add_column(column, overflow="fold")
        by_run: dict[int, list[float]] = {}
        for point in report["score_curve"]:
            by_run.setdefault(point["run"], []).append(point["score"])
        for run in reversed(report["runs"]):  # oldest first, as the curve goes
            scores = by_run.get(run["id"], [])
            curve.add_row(str(run["id"]), run["status"], " ".join(_score(s) for s in scores) or "—",
                          _sparkline(scores))
        console.print(curve)

    def _rollback(self, user: Any, agent: Any, tag: str) -> None:
        sha = self._guarded(lambda: agent_rollback(user, agent, tag))
        self.stdout.write(printable(f"{agent.name} (agent {agent.pk}) rolled back to {tag}: "
                                     f"new commit {sha}"))

    def _cancel(self, user: Any, run: Any) -> None:
        run = self._guarded(lambda: evolution_run_cancel(user, run))
        self.stdout.write(f"run {run.number}: {run.status}")


def option_value(text: str) -> bool | int | float | str:
    """A --option value: true/false (any case), a whole number, a number, or the text itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            number = kind(text.strip())
        except ValueError:
            continue
        if math.isfinite(number):  # "nan" and "inf" stay text
            return number
    return text


def _options_file(file: str, fail: Any) -> dict[str, Any]:
    """The table a .toml or .json file holds; `fail` gets one line naming the problem and, for a
    file that does not parse, its line and column."""
    path = Path(file).expanduser()
    kind = path.suffix.lower()
    if kind not in (".toml", ".json"):
        fail([f"{file}: --options takes a .toml or .json file"])
    try:
        raw = path.read_bytes()
    except OSError as error:
        fail([f"{file}: cannot be read ({error.strerror})"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail([f"{file}: not UTF-8 text"])
    try:
        data = tomllib.loads(text) if kind == ".toml" else json.loads(text)
    except tomllib.TOMLDecodeError as error:
        where = re.search(r"\(at line (\d+), column (\d+)\)$", str(error))
        message = re.sub(r"\s*\(at (?:line \d+, column \d+|end of document)\)$", "", str(error))
        place = f"{where.group(1)}:{where.group(2)}" if where else str(text.count("\n") + 1)
        fail([f"{file}:{place}: {message}"])
    except json.JSONDecodeError as error:
        fail([f"{file}:{error.lineno}:{error.colno}: {error.msg}"])
    if not isinstance(data, dict):
        fail([f"{file}: give a table of options (key = value), not {type(data).__name__}"])
    return data


def _sparkline(scores: list[float]) -> str:
    """Scores in [0, 1] as block characters (others are clamped)."""
    top = len(_SPARKS) - 1
    return "".join(_SPARKS[round(min(max(score, 0.0), 1.0) * top)] for score in scores)


def _changes(cycle: Any) -> str:
    parts = [f"+{name}" for name in cycle.skills_added] + [f"~{name}" for name in cycle.skills_modified]
    parts += [f"-{name}" for name in cycle.skills_deleted]
    if cycle.prompt_size_change:
        parts.append(f"prompt {cycle.prompt_size_change:+d} chars")
    return " ".join(parts)


def _cycle_line(cycle: Any) -> str:
    """One recorded cycle, as the non-terminal display prints it."""
    holdout = f", holdout {_score(cycle.holdout_score)}" if cycle.holdout_score is not None else ""
    what = cycle.summary or cycle.reason
    changes = _changes(cycle)
    return (f"cycle {cycle.number}: score {_score(cycle.score)}{holdout}, {cycle.get_status_display()}"
            f"{' (' + changes + ')' if changes else ''}{': ' + what if what else ''}")


def _cycle_rows(table: Any, cycles: list[Any]) -> None:
    for cycle in cycles:
        holdout = _score(cycle.holdout_score)
        if cycle.holdout_after is not None:
            holdout += f" → {_score(cycle.holdout_after)}"
        note = cycle.summary
        if cycle.reason:
            note = f"{note} ({cycle.reason})" if note else cycle.reason
        table.add_row(str(cycle.number), cycle.get_status_display(), _score(cycle.score), holdout,
                      printable(_changes(cycle)), printable(note))


def _cycle_table(title: str) -> Any:
    table = Table(title=printable(title), title_justify="left", caption_justify="left")
    for column in ("cycle", "status", "score", "holdout", "changes", "summary"):
        table.add_column(column, overflow="fold")
    return table


def _live_view(run: Any, cycles: list[Any], elapsed: float) -> Any:
    done = [cycle for cycle in cycles if cycle.status not in ("solving", "evolving")]
    table = _cycle_table(f"run {run.number}: cycle {len(done) + 1} of {run.cycles_planned} running "
                         f"({elapsed:.0f} s)")
    _cycle_rows(table, done)
    return table


def _run_table(run: Any, cycles: list[Any]) -> Any:
    title = f"{run.agent.name} run {run.number} ({run.engine} on {run.benchmark}): {run.get_status_display()}"
    if run.converged:
        title += ", converged"
    table = _cycle_table(title)
    _cycle_rows(table, sorted(cycles, key=lambda cycle: cycle.number))
    scores = [cycle.score for cycle in sorted(cycles, key=lambda c: c.number) if cycle.score is not None]
    caption = run.reason or ""
    if scores:
        caption = f"score {_score(scores[0])} → {_score(scores[-1])} {_sparkline(scores)}. {caption}".strip()
    table.caption = printable(caption)
    return table
