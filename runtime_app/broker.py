"""The embedded broker: kombu's filesystem transport, made safe for a worker that runs for days.

kombu's own transport creates a message file and then writes it, so a reader listing the queue
folder in between takes an empty file and the worker dies on the JSONDecodeError (kombu issue
#1551). Here a message is written under a hidden name in the queue folder and renamed into
place, so readers see a whole message or none. A file that still cannot be read (cut short by a
power loss, dropped in by hand, from an older writer) is moved to the quarantine folder with a
warning instead of raising: a message lost that way only delays work, as the reconciler
(search_app.tasks.steps_reconcile) drives every running search again.

Settings name this class with CELERY_BROKER_TRANSPORT; the URL stays `filesystem://`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    """Atomic writes, and a reader that sets an unreadable message aside instead of dying."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # Zero-padded milliseconds so names sort in sending order across every process.
        name = f"{round(monotonic() * 1000):015d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: no reader takes or counts it (they match `<stamp>.<queue>.msg`).
        temporary = os.path.join(self.data_folder_out, f".{name}.tmp")
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.rename(temporary, final)  # same folder, so atomic: whole or absent
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        # kombu creates an exchange's table file empty and then writes it, so a publisher reading
        # it in between fails; an empty table, linked into place whole, closes that window.
        file = self._exchange_file(exchange)
        if not file.exists():
            self.control_folder.mkdir(exist_ok=True)
            temporary = file.with_name(f".{file.name}.{uuid.uuid4()}.tmp")
            temporary.write_bytes(b"[]")
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.link(temporary, file)
            temporary.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def _get(self, queue: str) -> dict:
        wanted = f"{queue}.msg"
        for filename in sorted(os.listdir(self.data_folder_in)):
            if filename.partition(".")[2] != wanted:
                continue
            claimed = self.claim_folder / filename
            try:
                # A rename, not a copy: of two readers exactly one gets each message.
                os.rename(os.path.join(self.data_folder_in, filename), claimed)
            except FileNotFoundError:
                continue  # another consumer took it first
            try:
                payload = self._checked(claimed.read_bytes())
            except Exception as exc:  # whatever is wrong with the file, set it aside, never raise
                self._quarantine(claimed, exc)
                continue
            if not self.store_processed:
                claimed.unlink()
            return payload
        raise Empty()

    def _checked(self, raw: bytes) -> dict:
        """The payload, if the consumer can build a message of it (what it does next)."""
        payload = loads(bytes_to_str(raw))
        info = self.Message(payload, channel=self).delivery_info
        if not isinstance(info, dict) or not {"exchange", "routing_key"} <= info.keys():
            raise ValueError("no delivery_info with exchange and routing_key")
        return payload

    def _quarantine(self, claimed: Path, error: BaseException) -> None:
        folder = self.quarantine_folder
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            size = claimed.stat().st_size
            os.replace(claimed, folder / claimed.name)
        except OSError:
            size = -1
            with contextlib.suppress(OSError):
                claimed.unlink()
        logger.warning("Set aside unreadable broker message %s (%d bytes) in %s: %s: %s",
                       claimed.name, size, folder, type(error).__name__, str(error)[:200])

    @property
    def claim_folder(self) -> Path:
        """Where a reader moves a message it takes; next to the queue so the move is a rename."""
        return Path(self.processed_folder)

    @property
    def quarantine_folder(self) -> Path:
        return Path(self.transport_options.get(
            "quarantine_folder", Path(self.processed_folder).parent / "quarantine"))


class Transport(filesystem.Transport):
    """The filesystem transport with the channel above; no host name to default, so no warning."""

    Channel = Channel

    @property
    def default_connection_params(self) -> dict:
        return {"port": self.default_port}
