"""What the management commands (`project`, `search`, `evolve`) share: who acts, which project,
one line per refusal with its exit code, JSON and terminal output."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404
from rich.console import Console

from runtime_app.models import Project
from runtime_app.selectors import project_for_reference

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# Piped or redirected output (a file, a pager, a CI log) fits 100 columns: long cells wrap.
PIPED_WIDTH = 100

T = TypeVar("T")


def printable(text: object) -> str:
    """One line per message: control characters (from a spec, a workspace, a summary) are shown
    escaped, never sent to the terminal."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(text))


def console_for(out: Any) -> Console:
    """A rich console on `out`: a terminal's width, or PIPED_WIDTH when piped or redirected."""
    tty = out.isatty() if hasattr(out, "isatty") else False
    return Console(file=out, highlight=False, width=None if tty else PIPED_WIDTH)


def wrapped(line: str, width: int = PIPED_WIDTH, indent: int | None = None) -> list[str]:
    """A long line as several of at most `width` columns, each continuation indented as the
    line's own leading spaces (or `indent`); words longer than a line are broken."""
    if len(line) <= width:
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    return textwrap.wrap(line, width=width, subsequent_indent=" " * (lead if indent is None else indent),
                         break_on_hyphens=False) or [line]


def refusal_lines(error: ValidationError | PermissionDenied) -> list[str]:
    """A ValidationError's messages, each prefixed with its field unless it is `path` or global;
    a PermissionDenied's reason."""
    if isinstance(error, ValidationError) and hasattr(error, "error_dict"):
        lines: list[str] = []
        for field, messages in error.message_dict.items():
            prefix = "" if field in ("__all__", "path") else f"{field}: "
            lines.extend(prefix + message for message in messages)
        return lines
    if isinstance(error, ValidationError):
        return list(error.messages)
    return [str(error) or "You do not have permission."]


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def mail_log_path() -> Path:
    return Path(settings.CONFIG.data_dir) / "logs" / "mail.log"


@contextlib.contextmanager
def mail_to_file() -> Iterator[_Counter]:
    """While a command runs, the notification emails it sends (the `console` backend logs them,
    runtime_app/mail.py) go to `<data dir>/logs/mail.log`, not into the command's output."""
    logger = logging.getLogger("crucible.mail")
    path = mail_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s\n"))
    counter = _Counter()
    propagate, level = logger.propagate, logger.level
    logger.addHandler(handler)
    logger.addHandler(counter)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield counter
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(counter)
        logger.propagate, logger.level = propagate, level
        handler.close()


class CrucibleCommand(BaseCommand):
    """A management command that answers as the pages and the API do: the same services, and a
    refusal as one line on standard error with exit code 1 (or the code given).

    Its output is its own: notification emails it sends go to a file under the data dir (one line
    on standard error says how many), and with `--json` anything else that prints (a library, a
    hook) goes to standard error, so standard output is exactly one JSON document."""

    def execute(self, *args: Any, **options: Any) -> Any:
        stray = contextlib.redirect_stdout(sys.stderr) if options.get("json") else contextlib.nullcontext()
        with mail_to_file() as mails, stray:
            try:
                return super().execute(*args, **options)
            finally:
                if mails.count:
                    self.stderr.write(f"{mails.count} notification email{'s' if mails.count != 1 else ''} "
                                      f"logged to {mail_log_path()}", style_func=lambda text: text)

    def fail(self, lines: list[str], code: int = 1) -> NoReturn:
        for line in lines:
            self.stderr.write(printable(line), style_func=lambda text: text)
        raise SystemExit(code)

    def user_get(self, username: str | None) -> AbstractBaseUser:
        """The account named `username` (who acts; None: the admin account), or exit 1."""
        username = username or settings.CONFIG.admin_username
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            self.fail([f"no user named {username!r}: pass --user with an existing account"])
        return user

    def project_get(self, user: AbstractBaseUser, name: str, *, missing: str = "") -> Project:
        """The project named `name` that `user` may see, or exit 1 with `missing` (by default:
        create it first or pass --project)."""
        try:
            return project_for_reference(user, name)
        except Http404:
            self.fail([missing or f"no project named {name!r}: create it first "
                                  "(`manage.py crucible_setup` makes `demo`) or pass --project"])

    def guarded(self, call: Callable[[], T], actor: str,
                refusals: tuple[type[Exception], ...] = ()) -> T:
        """The service's answer, or its refusal as one line per message and exit 1 (a permission
        refusal says whose); `refusals` are further errors reported by their text."""
        try:
            return call()
        except ValidationError as error:
            self.fail(refusal_lines(error))
        except PermissionDenied as error:
            self.fail([f"{actor}: {line}" for line in refusal_lines(error)])
        except refusals as error:
            self.fail([str(error)])

    def json_write(self, data: Any, *, ensure_ascii: bool = False) -> None:
        """`data` as one indented JSON document on standard output."""
        self.stdout.write(json.dumps(data, indent=2, cls=DjangoJSONEncoder, ensure_ascii=ensure_ascii))
