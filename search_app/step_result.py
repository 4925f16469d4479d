"""The one contract between a step's work (execution.py) and the scheduler (services/steps.py).

Each step kind's work returns a `StepResult`; the scheduler records it and applies it to the
candidate and the run. `stored()` is what `Step.result` keeps (JSON): the fields the work set,
under the keys they always had, so results stored before this type existed read the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# Too big to keep in Step.result: the patch goes to Candidate.patch instead.
NOT_STORED = ("patch_hex",)


@dataclass
class StepResult:
    """What a step's work found. A field left None (or `cancelled` left False) was not set: it is
    absent from the stored result, as the key was from the dicts this replaces."""

    receipts: list[int] | None = None
    usage: dict[str, int] | None = None
    cancelled: bool = False
    # A runtime fault: the step fails with this reason.
    error: str | None = None
    # A command of the spec cannot start (preflight.py): the search stops.
    spec_failure: str | None = None
    # The candidate is out (its patch, its gates, its writer), with this reason.
    eliminated: str | None = None
    gates_passed: int | None = None
    # generate
    writer_outcome: str | None = None
    stop: str | None = None
    transcript: list[dict[str, str]] | None = None
    patch_sha256: str | None = None
    diff_lines: int | None = None
    files: list[Any] | None = None
    refining: str | None = None
    patch_hex: str | None = None
    # measure and replay: by member, by block
    values: dict[str, dict[str, float]] | None = None
    durations: dict[str, dict[str, float]] | None = None
    # what the runtime measured of each trial besides its wall time: CPU seconds, peak KiB
    cpu: dict[str, dict[str, float]] | None = None
    rss: dict[str, dict[str, float]] | None = None
    dropped: dict[str, str] | None = None
    blocks: list[int] | None = None
    members: list[str] | None = None
    trees_parked_before: list[str] | None = None
    # review
    verdict: str | None = None
    findings: list[dict[str, Any]] | None = None
    reviewer: str | None = None
    review_receipt: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every field set, the patch bytes included."""
        return {f.name: value for f in fields(self)
                if (value := getattr(self, f.name)) is not None and value is not False}

    def stored(self) -> dict[str, Any]:
        """What Step.result keeps."""
        return {key: value for key, value in self.as_dict().items() if key not in NOT_STORED}
