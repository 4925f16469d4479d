"""Host files a spec names: hidden evaluator files (`[evaluator.files]` entries `{ path = … }` /
`{ dir = … }`) and the read paths of its commands (`read_paths` in `[worker]`, `[hard_gates]`,
`[score]`).

Both are read only under an administrator's roots (CRUCIBLE_EVALUATOR_ROOTS, CRUCIBLE_READ_ROOTS),
at freeze, with caps. Hidden files are snapshotted into the database (`HiddenFile`), so what an
evaluation tree receives is what was frozen, whatever happens on the host later; read paths are
hashed (the sandbox shows them read-only as they are) and checked again when a search starts.
A path outside the roots gets the same answer whether or not it exists.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from search_app.frozen import search_spec
from search_app.models import HiddenFile
from search_app.spec import HardGatesSpec, ScoreSpec, SearchSpec, WorkerSpec, _check_repo_path

MIB = 1 << 20
# Hidden host files: what every evaluation tree of a search receives, kept in the database.
HIDDEN_MAX_FILES = 2_000
HIDDEN_MAX_BYTES = 10 * MIB
# Read paths: hashed at freeze and at start, never copied; a toolchain or a data set may be large.
READ_MAX_FILES = 10_000
READ_MAX_BYTES = 256 * MIB
_DIRS_PER_FILE = 5  # directories walked per file allowed, so a tree of empty dirs is bounded too
_CHUNK = 1 << 20
READ_SECTIONS = ("worker", "hard_gates", "score")


class HostPathError(ValueError):
    """A host path cannot be used; the message names the path and what to do."""


class CapError(HostPathError):
    """A search's host files went over a cap: reported once, and nothing more is read."""


@dataclass(frozen=True)
class HostFile:
    """One file (or, in a read path, one symlink) found under a declared host path."""

    relative: str  # below the declared path; "" when the declared path is the file itself
    source: str  # the host path, as spelled from the declared one
    sha256: str = ""
    size: int = 0
    executable: bool = False
    data: bytes | None = None  # kept for hidden files only
    symlink: str = ""  # a read path's symlink: its target, hashed instead of followed


@dataclass
class _Budget:
    """What is left of a search's caps; every read path (or hidden file) of a search shares one."""

    what: str
    files: int
    bytes: int
    dirs: int = 0
    advice: str = ""

    def __post_init__(self) -> None:
        self.max_files, self.max_bytes = self.files, self.bytes
        self.dirs = self.files * _DIRS_PER_FILE

    def file(self, source: str) -> None:
        self.files -= 1
        if self.files < 0:
            raise CapError(f"{source}: {self.what} hold more than {self.max_files:,} files in all; "
                                f"{self.advice}")

    def take(self, source: str, count: int) -> None:
        self.bytes -= count
        if self.bytes < 0:
            size = f"{self.max_bytes // MIB} MiB" if self.max_bytes >= MIB else f"{self.max_bytes:,} bytes"
            raise CapError(f"{source}: {self.what} hold more than {size} in all; "
                                f"{self.advice}")

    def directory(self, source: str) -> None:
        self.dirs -= 1
        if self.dirs < 0:
            raise CapError(f"{source}: {self.what} hold more than {self.max_files * _DIRS_PER_FILE:,} "
                                f"directories in all; {self.advice}")


def hidden_budget() -> _Budget:
    return _Budget("hidden evaluator files from the host", HIDDEN_MAX_FILES, HIDDEN_MAX_BYTES,
                   advice="keep only what the evaluation needs")


def read_budget() -> _Budget:
    return _Budget("read paths", READ_MAX_FILES, READ_MAX_BYTES, advice="declare narrower paths")


# ----------------------------------------------------------------------------------- the roots


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def roots_problem(given: str, roots: Sequence[Path], setting: str) -> str | None:
    """Why `given` may not be read, or None. Outside the roots, the answer is the same whether
    or not the path exists (no existence oracle): symlinks are resolved first, so a link inside a
    root that leads out of it is outside too."""
    if not roots:
        return (f"{given}: no host paths are allowed here: an administrator sets {setting} "
                "(comma-separated absolute directories) to allow them")
    real = os.path.realpath(given)
    if not any(_inside(real, os.path.realpath(root)) for root in roots):
        return f"{given} is not under {setting} ({', '.join(str(root) for root in roots)}); move it there"
    for place, why in _never_readable():
        if _inside(real, place) or _inside(place, real):
            return f"{given} would show commands {why}; declare another path"
    return None


def _never_readable() -> list[tuple[str, str]]:
    """Places no declared path may show, whatever the roots allow."""
    return [(os.path.realpath(settings.DATA_DIR), "Crucible's data dir (its database and keys)")]


# ------------------------------------------------------------------------------------ reading


def host_read(given: str, *, roots: Sequence[Path], setting: str, budget: _Budget, keep: bool,
              symlinks: str) -> list[HostFile]:
    """Every file under the declared host path `given` (a file or a directory), in path order.

    `keep` keeps the bytes (hidden files); `symlinks` is "refuse" (hidden files: a link inside
    a directory is refused with its path) or "record" (read paths: a link's target is recorded,
    not followed). Sockets, FIFOs and devices are refused with their path.
    """
    problem = roots_problem(given, roots, setting)
    if problem:
        raise HostPathError(problem)
    real = os.path.realpath(given)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        raise HostPathError(f"{given}: no such file or directory") from None
    except OSError as error:
        raise HostPathError(f"{given}: cannot be read by the Crucible server ({error.strerror})") from None
    if stat.S_ISREG(info.st_mode):
        budget.file(given)
        return [_file(real, given, "", budget, keep)]
    if not stat.S_ISDIR(info.st_mode):
        raise HostPathError(f"{given}: not a regular file or directory")
    return list(_walk(real, given, "", budget, keep, symlinks))


def _walk(real: str, source: str, relative: str, budget: _Budget, keep: bool,
          symlinks: str) -> Iterator[HostFile]:
    budget.directory(source)
    try:
        entries = sorted(os.scandir(real), key=lambda entry: entry.name)
    except OSError as error:
        raise HostPathError(f"{source}: cannot be read by the Crucible server ({error.strerror})") from None
    for entry in entries:
        child_source, child_relative = f"{source}/{entry.name}", f"{relative}{entry.name}"
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            if symlinks == "refuse":
                raise HostPathError(f"{child_source}: a symlink; hidden files are copied as regular files "
                                    "only: replace it with the file it points at")
            budget.file(child_source)
            target = os.readlink(entry.path)
            yield HostFile(child_relative, child_source, symlink=target,
                           sha256=hashlib.sha256(os.fsencode(target)).hexdigest())
        elif stat.S_ISDIR(info.st_mode):
            yield from _walk(entry.path, child_source, child_relative + "/", budget, keep, symlinks)
        elif stat.S_ISREG(info.st_mode):
            budget.file(child_source)
            yield _file(entry.path, child_source, child_relative, budget, keep)
        else:
            raise HostPathError(f"{child_source}: a socket, FIFO or device, not a regular file; remove it")


def _file(real: str, source: str, relative: str, budget: _Budget, keep: bool) -> HostFile:
    # O_NONBLOCK: a FIFO swapped in after the scan cannot hang the freeze; O_NOFOLLOW: nor a link.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as error:
        raise HostPathError(f"{source}: cannot be read by the Crucible server ({error.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise HostPathError(f"{source}: not a regular file")
        digest, chunks, size = hashlib.sha256(), [], 0
        while chunk := handle.read(_CHUNK):
            budget.take(source, len(chunk))
            digest.update(chunk)
            size += len(chunk)
            if keep:
                chunks.append(chunk)
    return HostFile(relative, source, digest.hexdigest(), size, bool(info.st_mode & 0o111),
                    b"".join(chunks) if keep else None)


# ------------------------------------------------------------------------------ hidden files


@dataclass(frozen=True)
class HiddenSnapshot:
    """One hidden file an evaluation tree receives, read from the host at freeze."""

    path: str
    source: str
    data: bytes
    sha256: str
    executable: bool

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": len(self.data), "source": self.source,
                "mode": "100755" if self.executable else "100644"}


@dataclass
class HostReport:
    """What freezing read from the host, and what went wrong, by spec key."""

    hidden: list[HiddenSnapshot] = field(default_factory=list)
    read_paths: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    problems: list[tuple[tuple[str, ...], str]] = field(default_factory=list)


def hidden_snapshots(spec: SearchSpec, report: HostReport) -> None:
    """Read every host hidden file of `spec` into `report` (problems by spec key)."""
    roots = settings.CONFIG.evaluator_roots
    budget = hidden_budget()
    inline = set(spec.evaluator.inline())
    taken: dict[str, str] = {path: path for path in inline}
    for dest, source in sorted(spec.evaluator.host().items()):
        key = ("evaluator", "files", dest)
        try:
            found = host_read(source.host_path, roots=roots, setting="CRUCIBLE_EVALUATOR_ROOTS",
                              budget=budget, keep=True, symlinks="refuse")
        except HostPathError as error:
            report.problems.append((key, str(error)))
            if isinstance(error, CapError):
                return
            continue
        if source.dir and not found:
            report.problems.append((key, f"{source.dir}: an empty directory; nothing to hide"))
        for item in found:
            path = f"{dest}/{item.relative}" if source.dir else dest
            try:
                _check_repo_path(path)
            except ValueError as error:
                report.problems.append((key, f"{item.source} would land at {path}: expected {error}"))
                continue
            clash = next((other for other in taken if path == other or _inside(path, other)
                          or _inside(other, path)), None)
            if clash is not None:
                report.problems.append((key, f"{item.source} would land at {path}, where {taken[clash]} "
                                             "already puts a hidden file; give each file one place"))
                continue
            taken[path] = item.source
            report.hidden.append(HiddenSnapshot(path, item.source, item.data or b"", item.sha256,
                                                item.executable))


def hidden_files(search: Any, spec: SearchSpec | None = None) -> dict[str, bytes]:
    """Every hidden file an evaluation tree of `search` receives, as frozen: inline contents from
    its spec (`spec`, when the caller has it resolved already), host files from its snapshot;
    each checked against its frozen hash."""
    frozen = {item["path"]: item["sha256"]
              for item in (search.hashed_inputs or {}).get("evaluator", {}).get("hidden_files", [])}
    spec = spec if spec is not None else search_spec(search)
    files = {path: content.encode() for path, content in spec.evaluator.inline().items()}
    files.update({row.path: bytes(row.content) for row in search.hidden_files.all()})
    for path, data in files.items():
        if frozen and frozen.get(path) != hashlib.sha256(data).hexdigest():
            raise HostPathError(f"hidden file {path} does not match its frozen hash; not used")
    missing = sorted(set(frozen) - set(files))
    if missing:
        raise HostPathError(f"hidden file {missing[0]} has no snapshot; the search cannot be evaluated")
    return files


def hidden_executable(search: Any) -> list[str]:
    """The hidden files of `search` that were executable on the host."""
    return list(HiddenFile.objects.filter(search=search, executable=True).values_list("path", flat=True))


def hidden_files_write(worktree: Path, files: Mapping[str, bytes], executable: Collection[str]) -> None:
    """Hidden evaluator files arrive only now, after every writer's authority is gone: the bytes
    frozen with the search (`hidden_files`), with the mode they had on the host (`executable`)."""
    root = worktree.resolve()
    for relative, data in files.items():
        target = (worktree / relative).resolve()
        if root not in target.parents:
            raise HostPathError(f"hidden file {relative} would land outside the evaluation tree")
        if target.is_symlink() or target.is_dir():
            raise HostPathError(f"hidden file {relative} collides with a link or directory in the patch")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o755 if relative in executable else 0o644)


# -------------------------------------------------------------------------------- read paths


def read_path_records(spec: SearchSpec, report: HostReport) -> None:
    """Hash every declared read path of `spec` into `report.read_paths` (by section)."""
    roots = settings.CONFIG.read_roots
    budget = read_budget()
    hidden_roots = [os.path.realpath(root) for root in settings.CONFIG.evaluator_roots]
    for section in READ_SECTIONS:
        for index, given in enumerate(section_read_paths(spec, section)):
            key = (section, "read_paths", str(index))
            real = os.path.realpath(given)
            overlaps = any(_inside(real, root) or _inside(root, real) for root in hidden_roots)
            if section == "worker" and overlaps:
                report.problems.append((key, f"{given} overlaps CRUCIBLE_EVALUATOR_ROOTS: writers must never "
                                             "see hidden evaluator files; declare another path"))
                continue
            try:
                found = host_read(given, roots=roots, setting="CRUCIBLE_READ_ROOTS", budget=budget,
                                  keep=False, symlinks="record")
            except HostPathError as error:
                report.problems.append((key, str(error)))
                if isinstance(error, CapError):
                    return
                continue
            report.read_paths.setdefault(section, []).append(_read_record(given, found))


def _read_record(given: str, found: list[HostFile]) -> dict[str, Any]:
    def one(item: HostFile) -> dict[str, Any]:
        if item.symlink:
            return {"path": item.relative, "symlink": item.symlink}
        return {"path": item.relative, "sha256": item.sha256, "size": item.size}

    if len(found) == 1 and found[0].relative == "":
        return {"path": given, **{k: v for k, v in one(found[0]).items() if k != "path"}}
    return {"path": given, "files": [one(item) for item in found]}


def section_read_paths(spec: SearchSpec, section: str) -> list[str]:
    """The host paths `section`'s commands may read, as the spec declares them."""
    sections: dict[str, WorkerSpec | HardGatesSpec | ScoreSpec] = {
        "worker": spec.worker, "hard_gates": spec.hard_gates, "score": spec.score}
    return list(sections[section].read_paths)


def readable_for(spec: SearchSpec, section: str) -> list[Path]:
    """What the sandbox shows, read-only, to `section`'s commands ("worker", "hard_gates", "score")
    besides the tree: passed as `readable=` to the sandbox."""
    return [Path(path) for path in section_read_paths(spec, section)]
