"""The `console` email backend: each notification email goes through the `crucible.mail` logger at
INFO (the server's log, on standard error), never onto a command's standard output.

Django's own console backend writes raw messages (headers and all) to standard output, which
lands inside the CLI's output and breaks `--json`. Management commands send the logger to a file
under the data dir instead (runtime_app/cli.py, `mail_to_file`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import EmailMessage

logger = logging.getLogger("crucible.mail")


def email_text(message: EmailMessage) -> str:
    """One email for a reader of the log: who, the subject, and the body (its links included)."""
    to = ", ".join(message.to) or "(no recipient)"
    return f"email to {to} from {message.from_email}: {message.subject}\n{message.body}".rstrip()


class LogEmailBackend(BaseEmailBackend):
    def send_messages(self, email_messages: Sequence[Any]) -> int:
        sent = 0
        for message in email_messages:
            logger.info("%s", email_text(message))
            sent += 1
        return sent
