"""`manage.py search validate|freeze|reference`: the CLI door into the same spec services.

    search validate FILE            every error as FILE:line:column path: message; exit 1 if any
    search freeze FILE --repo PATH --ref REF [--project demo] [--user admin]
    search reference [--write [PATH]]  the spec reference, generated from the schema

Exit codes: 0 done, 1 the spec or the freeze was refused, 2 the file could not be read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand

from runtime_app.models import Project
from runtime_app.services import repository_register
from search_app.reference import REFERENCE_PATH, spec_reference_markdown
from search_app.services import search_freeze
from search_app.spec import SpecReport, spec_validate

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    """One line per message: control characters from a spec (a key named "\\x1b[2J") are
    shown escaped, never sent to the terminal."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


class Command(BaseCommand):
    help = "Validate a search spec, freeze it against a git baseline, or print the spec reference."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{validate,freeze,reference}")
        validate = actions.add_parser("validate", help="check a spec file; `-` reads standard input")
        validate.add_argument("file", help="the spec (TOML); `-` for standard input")
        freeze = actions.add_parser("freeze", help="freeze a spec against a baseline commit")
        freeze.add_argument("file", help="the spec (TOML); `-` for standard input")
        freeze.add_argument("--repo", required=True, help="the git repository's path")
        freeze.add_argument("--ref", required=True, help="the baseline: a branch, tag, HEAD or commit sha")
        freeze.add_argument("--project", default="demo", help="the project's name (default: demo)")
        freeze.add_argument("--user", default=None, help="who freezes (default: the admin account)")
        reference = actions.add_parser("reference", help="print docs/spec-reference.md")
        reference.add_argument("--write", nargs="?", const=str(REFERENCE_PATH), default=None, metavar="PATH",
                               help=f"write it to a file (default: {REFERENCE_PATH})")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "validate":
            self._validate(options["file"])
        elif action == "freeze":
            self._freeze(options["file"], options["repo"], options["ref"], options["project"],
                         options["user"] or settings.CONFIG.admin_username)
        else:
            self._reference(write=options["write"])

    # --- helpers --------------------------------------------------------------------------

    def _fail(self, lines: list[str], code: int) -> None:
        for line in lines:
            self.stderr.write(_printable(line), style_func=lambda text: text)
        raise SystemExit(code)

    def _read(self, file: str) -> tuple[str, bytes]:
        """(label, bytes) of the spec; an unreadable file ends the command with exit code 2."""
        if file == "-":
            return "<stdin>", sys.stdin.buffer.read()
        try:
            return file, Path(file).read_bytes()
        except OSError as error:
            self._fail([f"{file}: cannot read the spec: {error.strerror or error}"], 2)
            raise  # unreachable: _fail exits

    @staticmethod
    def _error_lines(label: str, report: SpecReport) -> list[str]:
        return [f"{label}:{error}" for error in report.errors]

    # --- validate -------------------------------------------------------------------------

    def _validate(self, file: str) -> None:
        label, data = self._read(file)
        report = spec_validate(data)
        if not report.valid:
            for line in self._error_lines(label, report):
                self.stdout.write(_printable(line))
            count = len(report.errors)
            self._fail([f"{label}: {count} error{'s' if count != 1 else ''}"], 1)
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
            f"  selection   {summary['selection']}",
        ]
        for line in lines:
            self.stdout.write(_printable(line))

    # --- freeze ---------------------------------------------------------------------------

    def _freeze(self, file: str, repo: str, ref: str, project_name: str, username: str) -> None:
        label, data = self._read(file)
        report = spec_validate(data)
        if not report.valid:
            self._fail(self._error_lines(label, report), 1)
        project = Project.objects.filter(name=project_name).first()
        if project is None:
            self._fail([f"no project named {project_name!r}: create it first "
                        "(`manage.py crucible_setup` makes `demo`) or pass --project"], 1)
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            self._fail([f"no user named {username!r}: pass --user with an existing account"], 1)
        try:
            repository = repository_register(user, project, repo, trusted=True)
            search = search_freeze(user, project, data.decode("utf-8"), ref, repository=repository)
        except ValidationError as error:
            self._fail([str(message) for message in error.messages], 1)
        except PermissionDenied as error:
            self._fail([f"{username}: {error}"], 1)
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
            self.stdout.write(_printable(line))

    # --- reference ------------------------------------------------------------------------

    def _reference(self, *, write: str | None) -> None:
        text = spec_reference_markdown()
        if write:
            Path(write).write_text(text, encoding="utf-8")
            self.stdout.write(f"wrote {write}")
        else:
            self.stdout.write(text, ending="")
