"""One status a person understands, the same word on every list, page, API answer and CLI line.

search_app/status.py and evolve_app/status.py compute it for their subjects (searches, candidates,
evolution runs) from their own rows; this module only holds the words and their shape, so both
apps speak the same vocabulary while runtime_app imports neither (docs/reviewing-and-merging.md)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models

LABEL_DETAIL_CHARS = 90  # a label stays one short line; `detail` keeps the whole reason


class StatusWord(models.TextChoices):
    """The words. Each subject uses the ones that apply to it (see the functions computing them)."""

    DRAFTING = "drafting", "drafting"
    FROZEN = "frozen", "frozen"
    RUNNING = "running", "running"
    AWAITING_APPROVAL = "awaiting approval", "awaiting approval"
    CHANGES_REQUESTED = "changes requested", "changes requested"
    APPROVED = "approved", "approved"
    MERGED = "merged", "merged"
    NONE = "NONE", "NONE"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    # Candidates only: it fell (with why); and what ended without a verdict of its own
    # (the baseline of a finished search, an evolution run that ran its cycles).
    ELIMINATED = "eliminated", "eliminated"
    FINISHED = "finished", "finished"


# How a word looks (a CSS class `tone-…`): waiting for a person stands out, failures read red.
TONES: dict[str, str] = {
    StatusWord.DRAFTING: "muted", StatusWord.FROZEN: "muted", StatusWord.RUNNING: "running",
    StatusWord.AWAITING_APPROVAL: "pending", StatusWord.CHANGES_REQUESTED: "warn",
    StatusWord.APPROVED: "ok", StatusWord.MERGED: "ok", StatusWord.NONE: "none",
    StatusWord.FAILED: "bad", StatusWord.CANCELLED: "muted", StatusWord.ELIMINATED: "bad",
    StatusWord.FINISHED: "ok",
}


def _one_line(text: str) -> str:
    return " ".join((text or "").split())


@dataclass(frozen=True)
class Status:
    """`word` (a StatusWord), `detail` (the phase, "1 of 2 approvals", the branch, why) and
    `label`, the one line shown everywhere: "awaiting approval (1 of 2 approvals)"."""

    word: str
    detail: str = ""

    @property
    def detail_short(self) -> str:
        """The detail cut to fit a one-line label (the whole of it stays in `detail`)."""
        detail = _one_line(self.detail)
        if len(detail) > LABEL_DETAIL_CHARS:
            detail = detail[: LABEL_DETAIL_CHARS - 1].rstrip() + "…"
        return detail

    @property
    def label(self) -> str:
        return f"{self.word} ({self.detail_short})" if self.detail_short else str(self.word)

    @property
    def tone(self) -> str:
        return TONES.get(self.word, "muted")

    @property
    def css(self) -> str:
        """The badge's classes: `status status-awaiting-approval tone-pending`."""
        return f"status status-{str(self.word).lower().replace(' ', '-')} tone-{self.tone}"

    def as_dict(self) -> dict[str, str]:
        """The API's and the CLI's `status_info`."""
        return {"word": str(self.word), "detail": _one_line(self.detail), "label": self.label,
                "tone": self.tone}

    def __str__(self) -> str:
        return self.label


def status_make(word: str, detail: str = "") -> Status:
    return Status(StatusWord(word), _one_line(detail))
