"""`manage.py search …`: the CLI door into the same spec and run services.

    search validate FILE            every error as FILE:line:column path: message; exit 1 if any
    search validate FILE --repo PATH [--ref HEAD]   also what freeze would refuse there (stderr, exit 1)
    search freeze FILE --repo PATH --ref REF [--project demo] [--user admin]
    search run FILE --repo PATH [--ref HEAD] [--json]   freeze, run here to the end, show the outcome
    search run SEARCH_ID [--json] [--start-anyway]       run a frozen search here to the end
                                    (--start-anyway: even when its provider has no key or server)
    search run FILE --repo PATH --dry-run | SEARCH_ID --dry-run [--json]
                                    the forecast (writer steps, gate and trial runs, cost, wall time);
                                    freezes and starts nothing
    search status [--project P] [--status S] [--outcome O] [--mine] [--limit N] [--json]
                                    the searches you can see, newest first (id, project, status,
                                    round or phase, winner, started)
    search status SEARCH_ID [--json]  a search's state and candidates; its page and the next command
    search cancel SEARCH_ID
    search receipts SEARCH_ID [--candidate cand_007] [--json]
    search reference [--write [PATH]]  the spec reference, generated from the schema
    search comment SEARCH_ID CANDIDATE BODY [--path FILE [--line N [--side old]] | --reply-to ID] [--user U]
    search resolve|reopen SEARCH_ID CANDIDATE THREAD_ID [--user U]
    search approve|request-changes SEARCH_ID CANDIDATE --patch-sha256 HASH [--note TEXT] [--user U]
    search merge SEARCH_ID [--target new_branch|existing_branch] [--branch NAME] [--user U]
                                    the same services, checks and words as the candidate, decide
                                    and merge pages; one line of result, or of refusal (exit 1)

Tables fit the terminal, or 100 columns when piped (long cells wrap). Notification emails sent
while a command runs go to <data dir>/logs/mail.log (one line on standard error says so), and
with --json standard output is exactly one JSON document.

Exit codes: 0 done (a NONE outcome is a result, not an error), 1 the spec, the freeze or the
request was refused, 2 the file could not be read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.urls import reverse
from django.utils import timezone
from rich import box
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from runtime_app.cli import CrucibleCommand, console_for, printable, wrapped
from runtime_app.git import GitError, ref_resolve, repo_open
from runtime_app.presenters import short_sha
from runtime_app.prices import usd_text
from runtime_app.selectors import page_url, receipts_for_user
from runtime_app.services import repository_register, server_path_check
from search_app.execution import search_spec
from search_app.forecast import Forecast
from search_app.models import Approval, Merge, SearchRun, Step
from search_app.preflight import (
    preflight_report,
    provider_key_problems,
    provider_problems,
    search_path_warnings,
)
from search_app.reference import REFERENCE_PATH, spec_reference_markdown
from search_app.selectors import (
    SEARCH_LIST_OUTCOMES,
    SEARCH_LIST_STATUSES,
    approval_state,
    candidate_for_user,
    search_for_user,
    search_forecast,
    search_list_rows,
    search_run_report,
    search_time_left,
    spec_forecast,
)
from search_app.services import (
    ProviderUnready,
    approval_record,
    comment_add,
    merge_create,
    search_cancel,
    search_freeze,
    search_revise,
    search_run_inline,
    search_start_checked,
    thread_reopen,
    thread_resolve,
)
from search_app.spec import SpecReport, spec_validate, spec_warnings
from search_app.status import search_status_of
from search_app.templatetags.search_figures import metric_source

_SEARCH_ID = re.compile(r"search-[0-9a-f]{16}")


class Command(CrucibleCommand):
    help = ("Validate a search spec, freeze and run it, follow it; comment on a candidate, reply, resolve "
            "and reopen threads, approve or request changes to its winner and merge it; or print the spec "
            "reference.")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        validate = actions.add_parser("validate", help="check a spec file; `-` reads standard input")
        validate.add_argument("file", help="the spec (TOML); `-` for standard input")
        validate.add_argument("--repo", default=None,
                              help="also check it can run against this repository: what freeze refuses")
        validate.add_argument("--ref", default="HEAD", help="the baseline with --repo (default: HEAD)")
        freeze = actions.add_parser("freeze", help="freeze a spec against a baseline commit")
        freeze.add_argument("file", help="the spec (TOML); `-` for standard input")
        freeze.add_argument("--repo", required=True, help="the git repository's path")
        freeze.add_argument("--ref", required=True, help="the baseline: a branch, tag, HEAD or commit sha")
        freeze.add_argument("--project", default="demo", help="the project's name (default: demo)")
        freeze.add_argument("--user", default=None, help="who freezes (default: the admin account)")
        run = actions.add_parser("run", help="freeze a spec and run the search here to its outcome")
        run.add_argument("file", help="the spec (TOML); `-` for standard input; or a frozen search's id")
        run.add_argument("--repo", default=None, help="the git repository's path (with a spec file)")
        run.add_argument("--ref", default="HEAD", help="the baseline (default: HEAD)")
        run.add_argument("--project", default="demo", help="the project's name (default: demo)")
        run.add_argument("--user", default=None, help="who runs it (default: the admin account)")
        run.add_argument("--json", action="store_true", help="print the outcome as JSON, no live display")
        run.add_argument("--dry-run", action="store_true",
                         help="print the forecast and stop: nothing is frozen or started")
        run.add_argument("--start-anyway", action="store_true",
                         help="freeze and start even when the provider has no key here (it lives with the "
                              "workers) or its server does not answer")
        status = actions.add_parser("status", help="the searches you can see; or one search's state and "
                                                   "candidates, its page and the next command")
        status.add_argument("search_id", nargs="?", default=None,
                            help="e.g. search-1a2b3c4d5e6f7a8b (none: list the searches)")
        status.add_argument("--user", default=None, help="who asks (default: the admin account)")
        status.add_argument("--json", action="store_true", help="print JSON")
        status.add_argument("--project", default=None, help="list: only this project's searches")
        status.add_argument("--status", default="", choices=list(SEARCH_LIST_STATUSES),
                            help="list: only searches in this state")
        status.add_argument("--outcome", default="", choices=list(SEARCH_LIST_OUTCOMES),
                            help="list: only searches with this outcome")
        status.add_argument("--mine", action="store_true", help="list: only searches you froze")
        status.add_argument("--limit", type=int, default=20,
                            help="list: at most this many (default 20; 0: all)")
        for name, text in (("cancel", "stop a running search"),
                           ("receipts", "the receipts of a search's candidates")):
            sub = actions.add_parser(name, help=text)
            sub.add_argument("search_id", help="e.g. search-1a2b3c4d5e6f7a8b")
            sub.add_argument("--user", default=None, help="who asks (default: the admin account)")
            if name != "cancel":
                sub.add_argument("--json", action="store_true", help="print JSON")
            if name == "receipts":
                sub.add_argument("--candidate", default=None, help="only this candidate's receipts")
        comment = actions.add_parser("comment", help="comment on a candidate, or on one file and line of it")
        comment.add_argument("search_id", help="e.g. search-1a2b3c4d5e6f7a8b")
        comment.add_argument("candidate_id", help="e.g. cand_007")
        comment.add_argument("body", help="the comment's text; `-` for standard input")
        comment.add_argument("--path", default="", help="a file the candidate's patch changes")
        comment.add_argument("--line", type=int, default=None, help="a line of that file the diff shows")
        comment.add_argument("--side", choices=["new", "old"], default=None,
                             help="the side --line is on: new (after the patch; the default) or old")
        comment.add_argument("--reply-to", type=int, default=None, metavar="ID",
                             help="reply in this thread (no --path or --line then)")
        comment.add_argument("--user", default=None, help="who comments (default: the admin account)")
        for name, text in (("resolve", "mark a comment thread resolved"),
                           ("reopen", "open a resolved comment thread again")):
            thread = actions.add_parser(name, help=text)
            thread.add_argument("search_id", help="e.g. search-1a2b3c4d5e6f7a8b")
            thread.add_argument("candidate_id", help="e.g. cand_007")
            thread.add_argument("comment_id", help="the thread's id (its first comment's #)")
            thread.add_argument("--user", default=None, help="who does it (default: the admin account)")
        for name, text in (("approve", "approve a finished search's winner"),
                           ("request-changes", "request changes to a finished search's winner")):
            decide = actions.add_parser(name, help=text)
            decide.add_argument("search_id", help="e.g. search-1a2b3c4d5e6f7a8b")
            decide.add_argument("candidate_id", help="the winner, e.g. cand_007")
            decide.add_argument("--patch-sha256", required=True,
                                help="the SHA-256 of the patch you read; the decision is bound to it")
            decide.add_argument("--note", default="", help="why, for the timeline")
            decide.add_argument("--user", default=None, help="who decides (default: the admin account)")
        merge = actions.add_parser("merge", help="commit the approved winner onto a branch (never pushed)")
        merge.add_argument("search_id", help="e.g. search-1a2b3c4d5e6f7a8b")
        merge.add_argument("--target", choices=Merge.Target.values, default=Merge.Target.NEW_BRANCH,
                           help="a new branch (default) or an existing one still at the baseline")
        merge.add_argument("--branch", default="",
                           help="the branch (default for a new one: crucible/<search-id>)")
        merge.add_argument("--user", default=None, help="who merges (default: the admin account)")
        revise = actions.add_parser("revise", help="send the winner back to its writer to answer the changes "
                                                   "requested, and run the revision here to its end")
        revise.add_argument("search_id", help="e.g. search-1a2b3c4d5e6f7a8b")
        revise.add_argument("--note", default="", help="what you want, for the writer and the timeline")
        revise.add_argument("--user", default=None, help="who sends it back (default: the admin account)")
        revise.add_argument("--json", action="store_true", help="print the outcome as JSON")
        reference = actions.add_parser("reference", help="print docs/spec-reference.md")
        reference.add_argument("--write", nargs="?", const=str(REFERENCE_PATH), default=None, metavar="PATH",
                               help=f"write it to a file (default: {REFERENCE_PATH})")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "validate":
            self._validate(options["file"], options.get("repo"), options.get("ref") or "HEAD")
        elif action == "freeze":
            self._freeze(options["file"], options["repo"], options["ref"], options["project"],
                         options["user"] or settings.CONFIG.admin_username)
        elif action == "run":
            self._run(options["file"], options["repo"], options["ref"], options["project"],
                      options["user"] or settings.CONFIG.admin_username, as_json=options["json"],
                      dry_run=options["dry_run"], start_anyway=options["start_anyway"])
        elif action == "status" and not options["search_id"]:
            self._status_list(self.user_get(options["user"]), options)
        elif action in ("status", "cancel", "receipts"):
            user = self.user_get(options["user"])
            try:
                search = search_for_user(user, options["search_id"])
            except Http404:
                self.fail([f"no search {options['search_id']!r} that {user} can see"], 1)
            if action == "status":
                self._status(search, as_json=options["json"])
            elif action == "cancel":
                self._cancel(user, search)
            else:
                self._receipts(user, search, options["candidate"], as_json=options["json"])
        elif action in ("comment", "resolve", "reopen", "approve", "request-changes", "merge"):
            self._review(action, self.user_get(options["user"]), options)
        elif action == "revise":
            self._revise(self.user_get(options["user"]), options["search_id"],
                         options["note"], as_json=options["json"])
        else:
            self._reference(write=options["write"])

    # --- helpers --------------------------------------------------------------------------

    def _read(self, file: str) -> tuple[str, bytes]:
        """(label, bytes) of the spec; an unreadable file ends the command with exit code 2."""
        if file == "-":
            return "<stdin>", sys.stdin.buffer.read()
        try:
            return file, Path(file).read_bytes()
        except OSError as error:
            self.fail([f"{file}: cannot read the spec: {error.strerror or error}"], 2)
            raise  # unreachable: fail exits

    @staticmethod
    def _error_lines(label: str, report: SpecReport) -> list[str]:
        return [f"{label}:{error}" for error in report.errors]

    # --- validate -------------------------------------------------------------------------

    def _validate(self, file: str, repo: str | None = None, ref: str = "HEAD") -> None:
        label, data = self._read(file)
        report = spec_validate(data)
        if not report.valid:
            for line in self._error_lines(label, report):
                self.stdout.write(printable(line))
            count = len(report.errors)
            self.fail([f"{label}: {count} error{'s' if count != 1 else ''}"], 1)
        summary = report.summary()
        efforts = summary["efforts"]
        effort = efforts[0] if len(set(efforts)) == 1 else " → ".join(efforts)
        budget = [f"${summary['budget_usd']:,.2f}" if summary["budget_usd"] is not None else "",
                  f"{summary['budget_tokens']:,} tokens" if summary["budget_tokens"] is not None else ""]
        gates = len(summary["gates"])
        lines = [
            f"{label}: valid",
            f"  name        {summary['name']}",
            f"  rounds      {' → '.join(map(str, summary['rounds']))} "
            f"(population {summary['population']}, concurrency {summary['concurrency']})",
            f"  worker      {summary['provider']} {summary['model']}, effort {effort}",
            f"  budget      {', '.join(b for b in budget if b) or 'no ceiling'}",
            f"  gates       {gates} command{'s' if gates != 1 else ''}",
            f"  score       {summary['score']}",
            f"              {metric_source(report.spec.score)}",
            f"  selection   {summary['selection']}",
            *(f"  warning     {warning}" for warning in report.warnings),
        ]
        refused: list[str] = []
        if repo is not None:  # what freezing against this baseline would refuse, and warn about
            refused, warned = self._runnable(report.spec, repo, ref)
            lines += [f"  warning     {warning}" for warning in warned]
        for line in lines:
            for part in wrapped(printable(line), indent=14):
                self.stdout.write(part)
        if refused:
            self.fail([f"{label}: freeze would refuse: {problem}" for problem in refused], 1)

    def _runnable(self, spec: Any, repo: str, ref: str) -> tuple[list[str], list[str]]:
        """(problems, warnings) of freezing `spec` against `ref` of the repository at `repo`."""
        try:
            with repo_open(repo) as opened:
                commit = ref_resolve(opened, ref)
        except GitError as error:
            return [str(error)], []
        problems, warnings = preflight_report(spec, repo, commit)
        return [*problems, *provider_key_problems(spec.worker.provider)], warnings

    # --- freeze ---------------------------------------------------------------------------

    def _freeze(self, file: str, repo: str, ref: str, project_name: str, username: str) -> None:
        search = self._frozen(file, repo, ref, project_name, username)
        batches = search.candidate_batches
        candidates = sum(len(batch) for batch in batches)
        lines = [
            f"search id        {search.search_id}",
            f"preregistration  {search.preregistration_hash}",
            f"baseline commit  {search.baseline_commit} ({search.ref})",
            f"candidates       {candidates} in {len(batches)} batch{'es' if len(batches) != 1 else ''} "
            f"of up to {max(len(batch) for batch in batches)}",
        ]
        for line in lines:
            self.stdout.write(printable(line))
        spec = search_spec(search)
        for warning in [*provider_problems(spec.worker.provider), *spec_warnings(spec),
                        *search_path_warnings(search)]:
            self.stderr.write(printable(f"warning: {warning}"), style_func=lambda text: text)

    def _frozen(self, file: str, repo: str, ref: str, project_name: str, username: str, *,
                without_key: bool = False) -> Any:
        label, data = self._read(file)
        report = spec_validate(data)
        if not report.valid:
            self.fail(self._error_lines(label, report), 1)
        user = self.user_get(username)
        project = self.project_get(user, project_name)
        try:
            repository = repository_register(user, project, repo, trusted=True)
            search = search_freeze(user, project, data.decode("utf-8"), ref, repository=repository,
                                   without_key=without_key)
        except ValidationError as error:
            self.fail([str(message) for message in error.messages], 1)
        except PermissionDenied as error:
            self.fail([f"{username}: {error}"], 1)
        return search

    # --- run, status, cancel, receipts ----------------------------------------------------

    def _run(self, file: str, repo: str | None, ref: str, project_name: str, username: str, *,
             as_json: bool, dry_run: bool = False, start_anyway: bool = False) -> None:
        if _SEARCH_ID.fullmatch(file) and not Path(file).exists():
            user = self.user_get(username)
            try:
                search = search_for_user(user, file)
            except Http404:
                self.fail([f"no search {file!r} that {user} can see"], 1)
            if dry_run:
                self._forecast(search_forecast(search), search.name, search.search_id, as_json=as_json)
                return
        elif repo is None:
            self.fail([f"{file}: give the repository with --repo PATH (or name a frozen search's id)"], 1)
        elif dry_run:
            self._dry_run(file, repo, project_name, username, as_json=as_json)
            return
        else:
            search = self._frozen(file, repo, ref, project_name, username, without_key=start_anyway)
            user = self.user_get(username)
        try:
            search_start_checked(user, search, start_anyway=start_anyway, enqueue=False)
        except ProviderUnready as unready:
            self.fail([*unready.messages, "Nothing was started: fix it, or run "
                        f"`search run {search.search_id} --start-anyway`."], 1)
        except ValidationError as error:  # e.g. a command that cannot start: one line each
            self.fail([str(message) for message in error.messages], 1)
        except PermissionDenied as error:
            self.fail([str(error)], 1)
        started = f"Started {search.search_id}: {page_url(reverse('search_detail', args=[search.search_id]))}"
        # With --json, standard output stays one JSON document (its `warnings` key has these too).
        (self.stderr if as_json else self.stdout).write(started, style_func=lambda text: text)
        for warning in spec_warnings(search_spec(search)):
            for line in wrapped(printable(f"warning: {warning}"), indent=9):
                (self.stderr if as_json else self.stdout).write(line, style_func=lambda text: text)
        if as_json:
            search_run_inline(search)
            self.json_write(search_run_report(search), ensure_ascii=True)
            return
        console = console_for(self.stdout._out)
        console.print(f"[bold]{printable(search.name)}[/] {search.search_id} "
                      f"at {short_sha(search.baseline_commit)}")
        with Live(console=console, refresh_per_second=4, transient=True) as live:
            search_run_inline(search, progress=lambda run: live.update(_progress(search, run)))
        report = search_run_report(search)
        _spec_failure_print(console, report)
        console.print(_outcome_table(report, _status_label(search)))
        _summary_print(console, search, report)

    def _dry_run(self, file: str, repo: str, project_name: str, username: str, *, as_json: bool) -> None:
        """The forecast of a spec file against a repository's history: nothing is written."""
        label, data = self._read(file)
        report = spec_validate(data)
        if not report.valid:
            self.fail(self._error_lines(label, report), 1)
        user = self.user_get(username)
        project = self.project_get(user, project_name, missing=(
            f"no project named {project_name!r} that {username} is a member of: pass --project"))
        try:
            path = server_path_check(repo, trusted=True, what="repository")
            repo_open(path).close()
        except ValidationError as error:
            self.fail([str(message) for message in error.messages], 1)
        except GitError as error:
            self.fail([str(error)], 1)
        forecast = spec_forecast(report.spec, project.pk, str(path))
        self._forecast(forecast, report.spec.name, None, as_json=as_json)

    def _forecast(self, forecast: Forecast, name: str, search_id: str | None, *, as_json: bool) -> None:
        if as_json:
            self.json_write({"search_id": search_id, **forecast.as_dict()}, ensure_ascii=True)
            return
        for line in forecast_lines(forecast, name, search_id):
            for part in wrapped(printable(line), indent=17):
                self.stdout.write(part)

    def _status(self, search: Any, *, as_json: bool) -> None:
        report = search_run_report(search)
        if as_json:
            self.json_write(report, ensure_ascii=True)
            return
        console = console_for(self.stdout._out)
        _spec_failure_print(console, report)
        console.print(_outcome_table(report, _status_label(search)))
        _summary_print(console, search, report)

    def _status_list(self, user: Any, options: dict[str, Any]) -> None:
        """The searches `user` can see, newest first, with the list page's filters."""
        project = None
        if options["project"]:
            project = self.project_get(user, options["project"], missing=(
                f"no project named {options['project']!r} that {user} is a member of"))
        if options["limit"] < 0:
            self.fail(["--limit: give 0 (all) or a positive number"], 1)
        rows = search_list_rows(user, status=options["status"], outcome=options["outcome"], project=project,
                                sort="-created")
        if options["mine"]:
            rows = rows.filter(created_by=user)
        searches = list(rows[: options["limit"]] if options["limit"] else rows)
        items = [_list_item(search) for search in searches]
        if options["json"]:
            self.json_write(items, ensure_ascii=True)
            return
        console = console_for(self.stdout._out)
        if not items:
            console.print("No searches" + (" match these filters." if any(
                options[key] for key in ("project", "status", "outcome", "mine")) else " yet."))
            return
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
        for column in ("id", "project", "status", "round/phase", "winner", "started"):
            table.add_column(column, overflow="fold", no_wrap=column in ("id", "started"))
        for item in items:
            table.add_row(item["search_id"], printable(item["project"]), printable(item["status"]),
                          item["round_phase"], item["winner"] or "", item["started"] or "—")
        console.print(table)
        total = rows.count()
        if total > len(items):
            console.print(f"{len(items)} of {total} searches; --limit 0 lists all.")

    def _cancel(self, user: Any, search: Any) -> None:
        try:
            search_cancel(user, search)
        except (ValidationError, PermissionDenied) as error:
            self.fail([" ".join(getattr(error, "messages", [str(error)]))], 1)
        self.stdout.write(f"{search.search_id}: {search_status_of(search).label}")

    def _receipts(self, user: Any, search: Any, candidate_id: str | None, *, as_json: bool) -> None:
        candidates = search.candidates.all()
        if candidate_id:
            candidates = candidates.filter(candidate_id=candidate_id)
            if not candidates.exists():
                self.fail([f"{search.search_id} has no candidate {candidate_id!r}"], 1)
        names = dict(candidates.values_list("pk", "candidate_id"))
        receipts = receipts_for_user(user).filter(subject_type="candidate", subject_id__in=list(names))
        if as_json:
            self.json_write([r.as_dict() for r in receipts], ensure_ascii=True)
            return
        for receipt in receipts:
            line = printable(f"#{receipt.pk:<6} {names[receipt.subject_id]:<9} {receipt.kind:<8} "
                             f"{receipt.outcome:<14} {receipt.duration_seconds:8.3f} s  "
                             f"{receipt.isolation or '-':<13} {receipt.label}")
            for part in wrapped(line, indent=8):
                self.stdout.write(part)

    # --- comment, approve, request changes, merge ------------------------------------------

    def _review(self, action: str, user: Any, options: dict[str, Any]) -> None:
        """One line of result, or the service's refusal in its own words (exit 1)."""
        search_id = options["search_id"]
        try:
            if action == "merge":
                search = search_for_user(user, search_id)
            else:
                candidate = candidate_for_user(user, search_id, options["candidate_id"])
        except Http404:
            what = search_id if action == "merge" else f"{options['candidate_id']} of {search_id}"
            self.fail([f"no candidate or search {what!r} that {user} can see"], 1)
        try:
            if action == "comment":
                body = sys.stdin.read() if options["body"] == "-" else options["body"]
                comment = comment_add(user, candidate, body, options["path"], options["line"],
                                      options["reply_to"], options.get("side"))
                where = f" on {comment.path}" if comment.path else ""
                where += f":{comment.line}" if comment.line else ""
                where += " (old)" if comment.line and comment.side == "old" else ""
                where += f" in thread #{comment.reply_to_id}" if comment.reply_to_id else ""
                line = f"{search_id} {candidate.candidate_id}: comment #{comment.pk} by {user}{where}"
            elif action in ("resolve", "reopen"):
                change = thread_resolve if action == "resolve" else thread_reopen
                thread = change(user, candidate, options["comment_id"])
                by = f" (by {thread.state_changed_by_name})" if thread.state_changed_by_name else ""
                line = f"{search_id} {candidate.candidate_id}: thread #{thread.pk} is {thread.state}{by}"
            elif action == "merge":
                merge = merge_create(user, search, options["target"], options["branch"])
                line = (f"{search_id}: merged {merge.candidate.candidate_id} onto {merge.branch} as "
                        f"{merge.commit_sha} (not pushed)")
            else:
                decision = (Approval.Decision.APPROVE if action == "approve"
                            else Approval.Decision.REQUEST_CHANGES)
                approval = approval_record(user, candidate, decision, options["patch_sha256"],
                                           options["note"])
                state = approval_state(candidate)
                verb = "approved" if decision == Approval.Decision.APPROVE else "requested changes to"
                line = (f"{search_id}: {user} {verb} {candidate.candidate_id} (patch "
                        f"{short_sha(approval.patch_sha256)}); {state['blocker'] or 'ready to merge.'}")
        except ValidationError as error:
            self.fail([" ".join(error.messages)], 1)
        except PermissionDenied as error:
            self.fail([f"{user}: {error}"], 1)
        self.stdout.write(printable(line))

    def _revise(self, user: Any, search_id: str, note: str, *, as_json: bool) -> None:
        """Send the winner back (the service the page and the API call), then drive the revision
        in this process, as `run` does, and print the outcome."""
        try:
            search = search_for_user(user, search_id)
        except Http404:
            self.fail([f"no search {search_id!r} that {user} can see"], 1)
        try:
            run = search_revise(user, search, note, enqueue=False)
        except ValidationError as error:
            self.fail([" ".join(error.messages)], 1)
        except PermissionDenied as error:
            self.fail([f"{user}: {error}"], 1)
        (self.stderr if as_json else self.stdout).write(printable(f"{search_id}: {run.reason}"))
        search_run_inline(search)
        report = search_run_report(search)
        if as_json:
            self.json_write(report, ensure_ascii=True)
            return
        console = console_for(self.stdout._out)
        console.print(_outcome_table(report, _status_label(search)))
        _summary_print(console, search, report)

    # --- reference ------------------------------------------------------------------------

    def _reference(self, *, write: str | None) -> None:
        text = spec_reference_markdown()
        if write:
            Path(write).write_text(text, encoding="utf-8")
            self.stdout.write(f"wrote {write}")
        else:
            self.stdout.write(text, ending="")


def forecast_lines(forecast: Forecast, name: str, search_id: str | None) -> list[str]:
    """The forecast as the CLI prints it: a table of rounds, then cost, budget and wall time."""
    timed = forecast.wall_seconds is not None
    row = "  {:<12} {:>9} {:>13} {:>11} {:>11}" + ("  {}" if timed else "")
    lines = [f"{name}{f' {search_id}' if search_id else ''}: forecast — nothing was started",
             row.format("round", "survivors", "writer steps", "gate runs", "trial runs", "wall time")]
    for plan in forecast.rounds:
        lines.append(row.format(plan.index, plan.survivors, plan.writer_steps.text, plan.gate_runs.text,
                                plan.trial_runs.text, plan.wall_seconds.duration if timed else ""))
    replay_wall = forecast.replay_wall_seconds
    lines.append(row.format(f"replay ×{forecast.replays.text}", 1, 0, forecast.replay_gate_runs.text,
                            forecast.replay_trial_runs.text, replay_wall.duration if replay_wall else ""))
    lines.append(row.format("all", "", forecast.writer_steps.text, forecast.gate_runs.text,
                            forecast.trial_runs.text, forecast.wall_seconds.duration if timed else ""))
    calls = f", about {forecast.model_calls.text} model calls" if forecast.model_calls else ""
    lines += [
        f"  writers        {forecast.provider} {forecast.model}{calls}",
        f"  expected cost  {forecast.cost_text} (budget: {forecast.budget_text})",
        f"                 {forecast.cost_source}",
        f"  wall time      {forecast.wall_text}",
        f"                 {forecast.wall_source}",
        f"                 {forecast.wall_ceiling_text}: {forecast.wall_ceiling_source}",
    ]
    lines += [f"  warning: {warning}" for warning in forecast.warnings]
    lines += [f"  note: {note}" for note in forecast.notes]
    return [line.rstrip() for line in lines]


def _spec_failure_print(console: Any, report: dict) -> None:
    """A search stopped by a command that cannot start says so first, above the table."""
    if report.get("spec_failure"):
        console.print(f"[bold red]stopped: a command of the spec cannot start[/] — "
                      f"{escape(printable(report['spec_failure']))}")


def _progress(search: Any, run: Any) -> Any:
    """The live display: phase and round, candidates per state, budget."""
    counts: dict[str, int] = {}
    for state in search.candidates.exclude(number=0).values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    table = Table(show_header=False, box=None)
    in_rounds = run.phase == SearchRun.Phase.ROUNDS
    table.add_row("phase", f"{run.phase}, round {run.round_index}" if in_rounds else run.phase)
    table.add_row("candidates", ", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    live = search.steps.filter(state=Step.State.RUNNING).select_related("candidate")
    table.add_row("running", ", ".join(f"{s.kind} {s.candidate.candidate_id}" for s in live) or "—")
    if run.status == SearchRun.Status.RUNNING and run.phase != SearchRun.Phase.REVISE:
        left = search_time_left(search, run, timezone.now())
        table.add_row("time left", f"{left.text} · {left.worst_case_text}")
    if run.budget_cost_microusd or run.budget_tokens:
        ceiling = usd_text(run.budget_cost_microusd) if run.budget_cost_microusd else "∞"
        table.add_row("budget", f"{usd_text(run.spent_cost_microusd)} of {ceiling}, "
                                f"{run.spent_tokens:,} of {run.budget_tokens or '∞'} tokens")
    return table


def figure_cells(c: dict) -> tuple[str, str]:
    """A candidate's score and its median · spread, in the words and units of the pages
    (search_app/figures.py, through the report's `figures`); the bare figure for an older report."""
    shown = c.get("figures")
    if not shown:
        return c["figure"], f"{c['spread']:g}" if c["spread"] is not None else ""
    value = shown["value"] if shown["value"] != shown["score"] else ""
    return shown["score"], " · ".join(part for part in (value, shown["spread"]) if part)


def _status_label(search: Any) -> str:
    """A search's state as the CLI prints it: the one status of the pages and the API
    (search_app/status.py), e.g. "awaiting approval (1 of 2 approvals)"."""
    return search_status_of(search).label


def _list_item(search: Any) -> dict[str, Any]:
    """One row of `search status` without an id (JSON-ready)."""
    run = getattr(search, "run", None) if hasattr(search, "run") else None
    phase = ""
    if run is not None and run.status in (SearchRun.Status.RUNNING, SearchRun.Status.CANCELLING):
        phase = f"round {run.round_index}" if run.phase == SearchRun.Phase.ROUNDS else str(run.phase)
    winner = ""
    if run is not None and run.outcome == SearchRun.WINNER and run.winner_id:
        winner = run.winner.candidate_id
    elif run is not None and run.outcome == SearchRun.NONE:
        winner = SearchRun.NONE
    started = run.started_at if run is not None else None
    return {
        "search_id": search.search_id, "name": search.name, "project": search.project.name,
        "status": _status_label(search), "run_status": getattr(search, "list_status", ""),
        "round_phase": phase, "winner": winner,
        "started": _when(started) if started else None,
        "started_at": started.isoformat() if started else None,
        "url": page_url(reverse("search_detail", args=[search.search_id])),
    }


def _when(moment: Any) -> str:
    """"Dec 05 23:29" this year, "2025-12-05" before (as a code host lists runs)."""
    local = timezone.localtime(moment)
    return local.strftime("%b %d %H:%M") if local.year == timezone.localtime().year else f"{local:%Y-%m-%d}"


def next_command(search: Any, report: dict) -> str:
    """What a person does next with this search, as a command line ("" when nothing is left)."""
    search_id = search.search_id
    status, outcome = report.get("status"), report.get("outcome")
    if status == "not started":
        return f"manage.py search run {search_id}"
    if status in (SearchRun.Status.RUNNING, SearchRun.Status.CANCELLING):
        return f"manage.py search status {search_id}"
    if outcome != SearchRun.WINNER or not report.get("winner"):
        return ""
    standing = report.get("winner_status") or ""
    winner = report["winner"]
    if standing == "merged":
        return ""
    if standing == "approved":
        return f"manage.py search merge {search_id}"
    if standing == "changes requested":
        return f'manage.py search revise {search_id} --note "…"'
    sha = search.candidates.filter(candidate_id=winner).values_list("patch_sha256", flat=True).first()
    return f"manage.py search approve {search_id} {winner} --patch-sha256 {sha}"


def _summary_print(console: Any, search: Any, report: dict) -> None:
    """The lines under the table: the search's page, and the next command."""
    console.print(f"page: {page_url(reverse('search_detail', args=[search.search_id]))}", soft_wrap=True)
    command = next_command(search, report)
    merge = report.get("merge")
    if command:
        console.print("next:", soft_wrap=True)
        for line in command_lines(command):
            console.print(f"  {line}", soft_wrap=True, markup=False)
    elif merge:
        console.print(escape(f"merged onto {merge['branch']} as {merge['commit']} (not pushed)"),
                      soft_wrap=True)


def command_lines(command: str, width: int = 96) -> list[str]:
    """A command line to copy, broken before its options with a shell continuation when long."""
    if len(command) <= width:
        return [command]
    head, *options = command.split(" --")
    parts = [head, *(f"    --{option}" for option in options)]
    return [part + (" \\" if n < len(parts) - 1 else "") for n, part in enumerate(parts)]


def _outcome_table(report: dict, label: str | None = None) -> Any:
    """The candidates of a search under a title with its state; it fits the console (100 columns
    piped): short columns never wrap, the reason wraps, and columns with nothing in them are left
    out."""
    # The one status the pages show (search_app/status.py): "awaiting approval (1 of 2 approvals)".
    status = label or (report.get("status_info") or {}).get("label") or report["outcome"] or report["status"]
    title = f"{report['search_id']} {report['name']}: {status}"
    if report["winner"]:
        title += f" — winner {report['winner']}"
    if report.get("elapsed_text"):
        going = report["status"] in (SearchRun.Status.RUNNING, SearchRun.Status.CANCELLING)
        took = "running for" if going else "took"
        title += f"; {took} {report['elapsed_text']}"
        title += f", {report['eta_text']}" if report.get("eta_text") else ""
    # Whoever reads a score here also reads who measured it (docs/sandbox.md, the score contract).
    words = report.get("metric_source")
    words = metric_source(report["metric"]) if words in (None, "runtime") else words
    source = escape(printable(f"score: {report['metric']}, {words}"))
    table = Table(title=f"{escape(printable(title))}\n{source}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, collapse_padding=True)
    if report.get("metric_unit"):  # the unit and direction every figure below is in
        table.title += f"\n{escape(printable(report['metric_unit']['label']))}"
    if report.get("best") and report["best"].get("text"):
        best = report["best"]
        table.title += f"\nbest: {escape(printable(best['candidate_id'] + ' ' + best['text']))}"
    rows = []
    for c in report["candidates"]:
        receipts = c["receipts"]
        shown_figures = figure_cells(c)
        rows.append({
            "candidate": c["candidate_id"], "state": c["state"],
            "round": str(c["round_reached"]) if c["round_reached"] >= 0 else "",
            "gates": str(c["gates_passed"]), "score": shown_figures[0], "median · spread": shown_figures[1],
            "diff": str(c["diff_lines"] or ""),
            "cost": usd_text(c["cost_microusd"]) if c["cost_microusd"] else "",
            "receipts": f"#{receipts[0]}–#{receipts[-1]}" if receipts else "",
            "reason": printable(c["reason"]),
        })
    names = ("candidate", "state", "round", "gates", "score", "median · spread", "diff", "cost", "receipts",
             "reason")
    columns = [name for name in names
               if name in ("candidate", "state", "reason") or any(row[name] for row in rows)]
    for column in columns:
        if column == "reason":
            table.add_column(column, overflow="fold", ratio=1, min_width=20)
        else:
            numeric = column in ("round", "gates", "diff", "cost")
            table.add_column(column, no_wrap=numeric or column == "candidate", overflow="fold",
                             justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(row[column] for column in columns))
    if report["review"]:
        review = report["review"]
        table.caption = printable(f"review of {review['candidate']}: {review['verdict']}, "
                                   f"{len(review['findings'])} findings. {report['reason']}")
    else:
        table.caption = printable(report["reason"])
    table.caption_justify = "left"
    if report["llm"]["calls"]:
        llm = report["llm"]
        table.caption += (f" Model calls: {llm['calls']}, {usd_text(llm['cost_microusd'])}, "
                          f"cache hit ratio {llm['cache_hit_ratio']:.1%}.")
    return table
