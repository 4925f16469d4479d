"""Reading a metric from a command the runtime ran: measured by the runtime, or structured
output only, never prose.

The contract (docs/sandbox.md, "the score contract"):
- `runtime:wall_seconds`, `runtime:cpu_seconds` and `runtime:max_rss_kib` are measured by the
  runtime from outside the command (its reaping time, its cgroup's counters): nothing the
  command's code prints, writes or patches changes them.
- Any other metric is *reported by the score command*, and the spec says what it measures
  (`score.reported`). A time or memory figure comes from a JSON object written to the file named
  by `$CRUCIBLE_METRICS_FILE` (outside the command's tree), the report descriptor, or else the
  last non-empty line of stdout; code the command runs can forge any of those, so the search
  checks it against the runtime's own measurement of the same trials (search_app.measurement
  `report_contradicted`). A figure of another kind (`reported = "other"`) is read only from the
  report descriptor: the write end of a pipe handed to the score command's own process
  (`$CRUCIBLE_REPORT_FD`), which an evaluator keeps from the children that run candidate code.
  A spec frozen before `reported` existed reads as it always did, and is labelled forgeable.
A metric counts only when the command exited 0 within its time, and only as a finite number.
Anything else is no metric, with a reason a person can act on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from runtime_app.models import Receipt

METRICS_FILE_LIMIT = 1 << 20


RUNTIME_PREFIX = "runtime:"
# A reported metric of a search frozen before `score.reported`: nothing checks it.
REPORTED_LABEL = "reported by the score command (forgeable by code it runs)"
CORROBORATED_LABEL = "reported by the score command, checked against the runtime's wall and CPU time"
CORROBORATED_MEMORY_LABEL = "reported by the score command, checked against the runtime's peak memory"
DESCRIPTOR_LABEL = ("reported through the runtime's report descriptor (CRUCIBLE_REPORT_FD), which the "
                    "candidate's code does not hold")
DESCRIPTOR = "report descriptor"


def metric_source(metric: str, reported: str | None = None) -> str:
    """Who measures a score of `metric` (what `score.reported` says it is): `runtime`, or the
    words every page shows for a figure the score command reports about itself (scripts match
    the one short word for the trusted case)."""
    if str(metric).startswith(RUNTIME_PREFIX):
        return "runtime"
    if reported == "other":
        return DESCRIPTOR_LABEL
    if reported in ("memory_kib", "memory_bytes"):
        return CORROBORATED_MEMORY_LABEL
    return CORROBORATED_LABEL if reported else REPORTED_LABEL


@dataclass(frozen=True)
class MetricReading:
    value: float | None
    reason: str  # where the value came from, or why there is none
    source: str = ""  # "runtime", "metrics file", "report descriptor" or "last line of stdout"

    @property
    def counted(self) -> bool:
        return self.value is not None

    @property
    def reported(self) -> bool:
        """Whether the command reported the value about itself (and code it ran could forge it)."""
        return self.source not in ("", "runtime")


def runtime_metric(receipt: Receipt, metric: str) -> MetricReading:
    """A metric the runtime measured itself: wall seconds from start to reaping, CPU seconds
    (user + system) and peak memory of the command's whole process tree."""
    name = metric.removeprefix(RUNTIME_PREFIX)
    usage = receipt.rusage or {}
    if name == "wall_seconds":
        value = receipt.duration_seconds
    elif name == "cpu_seconds":
        user, system = usage.get("user_cpu_seconds"), usage.get("sys_cpu_seconds")
        value = None if user is None or system is None else user + system
    elif name == "max_rss_kib":
        value = usage.get("max_rss_kib")
    else:
        return MetricReading(None, f"{metric!r} is not a metric the runtime measures")
    if value is None:
        return MetricReading(None, f"the runtime could not measure {name} for this command")
    how = f" ({usage.get('measured_by')})" if name != "wall_seconds" and usage.get("measured_by") else ""
    return MetricReading(float(value), f"measured by the runtime{how}", "runtime")


def metric_read(receipt: Receipt, metric: str, metrics_file: str | Path | None = None, *,
                report_file: str | Path | None = None, descriptor_only: bool = False) -> MetricReading:
    """The named metric, if the command succeeded: measured by the runtime (`runtime:` names)
    or from the command's structured output: what came through the report descriptor
    (`report_file`), else the metrics file, else the last line of stdout; with `descriptor_only`
    (`reported = "other"`) from the descriptor alone."""
    if not receipt.succeeded:
        return MetricReading(None, f"the command {receipt.outcome}; a metric only counts after exit 0")
    if metric.startswith(RUNTIME_PREFIX):
        return runtime_metric(receipt, metric)
    if descriptor_only or (report_file is not None and Path(report_file).is_file()):
        data, source, problem = _descriptor_output(report_file)
    else:
        data, source, problem = _structured_output(receipt, metrics_file)
    if data is None:
        return MetricReading(None, problem)
    if metric not in data:
        names = ", ".join(sorted(map(str, data))[:10]) or "none"
        return MetricReading(None, f"the {source} has no metric {metric!r} (it has: {names})", source)
    value = data[metric]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return MetricReading(None, f"metric {metric!r} is {value!r}, not a finite number", source)
    label = DESCRIPTOR_LABEL if source == DESCRIPTOR else REPORTED_LABEL
    return MetricReading(float(value), f"from the {source}, {label}", source)


def _descriptor_output(report_file: str | Path | None) -> tuple[dict | None, str, str]:
    """What the score command's own process wrote to $CRUCIBLE_REPORT_FD (sandbox.run saved it)."""
    path = Path(report_file) if report_file is not None else None
    if path is None or not path.is_file():
        return None, DESCRIPTOR, ("the score command wrote nothing to its report descriptor "
                                  "($CRUCIBLE_REPORT_FD); a figure of this kind is read from there only, "
                                  "never from stdout or $CRUCIBLE_METRICS_FILE")
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as error:
        return None, DESCRIPTOR, f"what came through the report descriptor is not JSON: {error}"
    if not isinstance(data, dict):
        return None, DESCRIPTOR, "what came through the report descriptor is JSON but not an object"
    return data, DESCRIPTOR, ""


def _structured_output(receipt: Receipt, metrics_file: str | Path | None) -> tuple[dict | None, str, str]:
    if metrics_file is not None and Path(metrics_file).is_file():
        path = Path(metrics_file)
        if path.is_symlink() or path.stat().st_size > METRICS_FILE_LIMIT:
            return None, "file", "the metrics file is a symlink or larger than 1 MiB"
        try:
            data = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as error:
            return None, "file", f"the metrics file is not JSON: {error}"
        if not isinstance(data, dict):
            return None, "file", "the metrics file holds JSON that is not an object"
        return data, "metrics file", ""
    data, problem = last_json_line(receipt.stdout_excerpt)
    if data is None:
        return None, "stdout", {
            "empty": "the command wrote no metrics file and printed nothing",
            "not JSON": "no metrics file, and the last line of stdout is not a JSON object",
            "not an object": "the last line of stdout is JSON but not an object",
        }[problem]
    return data, "last line of stdout", ""


def last_json_line(text: str) -> tuple[dict | None, str]:
    """The JSON object a command printed as its last non-empty line (how score commands,
    command writers and reviewers report), or None and why: "empty", "not JSON" or
    "not an object"."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None, "empty"
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return None, "not JSON"
    if not isinstance(data, dict):
        return None, "not an object"
    return data, ""
