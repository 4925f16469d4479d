"""Reads for evolve_app, filtered by project membership (404 for outsiders).

The database answers what runs and cycles measured; the workspace's git repository answers what
the agent's files were at any snapshot (through EvolutionHistory and the sealed git CLI).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import yaml
from django.core.cache import caches
from django.core.exceptions import ValidationError
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.http import Http404
from django.urls import reverse

from evolve_app import workspace
from evolve_app.agents import agent_mapping
from evolve_app.history import _DIFF_OPTIONS, EvolutionHistory
from evolve_app.models import Agent, Cycle, EvolutionRun, ObservationRecord
from evolve_app.presenters import last_run_labels_set
from evolve_app.status import last_run_statuses, run_status
from evolve_app.workspace import (
    ImportPreview,
    WorkspaceError,
    manifest_warnings,
    workspace_git,
    workspace_manifest,
    workspace_preview,
)
from runtime_app import access
from runtime_app.git import GitError, ref_resolve, refs_list, repo_open
from runtime_app.models import Event, Project
from runtime_app.presenters import short_sha
from runtime_app.selectors import projects_for_user
from runtime_app.services import server_path_check
from runtime_app.subjects import Attention, ProjectSection

if TYPE_CHECKING:
    from datetime import datetime

    from django.contrib.auth.models import AbstractUser
    from django_stubs_ext import WithAnnotations

    class AgentRowFields(TypedDict):
        """What agent_list_rows adds to each agent: the annotations, then its rollback and label."""

        run_count: int
        last_run_status: str | None
        last_run_id: int | None
        last_run_number: int | None
        latest_score: float | None
        latest_scored_at: datetime | None
        rolled_back_to: str
        last_run_label: str
        last_run_tone: str

    AgentRow = WithAnnotations[Agent, AgentRowFields]

    class RunRowFields(TypedDict):
        """What agent_runs annotates each run with."""

        cycle_count: int
        last_score: float | None

    RunRow = WithAnnotations[EvolutionRun, RunRowFields]

ROLLBACK_TAG = re.compile(r"\bevo-(\d{1,9})\b")
SKILL_PATH = re.compile(r"skills/([a-z0-9][a-z0-9_-]{0,63})/SKILL\.md")
DRAFT_PATH = re.compile(r"skills/_drafts/([a-z0-9][a-z0-9_-]{0,63})\.md")
MEMORY_PATH = re.compile(r"memory/([a-z0-9][a-z0-9_-]{0,63})\.jsonl")
MEMORY_MAX_ENTRIES = 200  # per memory file shown
OBSERVATIONS_MAX = 500  # per cycle page
DIFF_MAX_BYTES = 2_000_000


# ---- agents


def agents_for_user(user: AbstractUser) -> QuerySet[Agent]:
    return Agent.objects.select_related("project").filter(project__in=projects_for_user(user))


def agent_list_rows(user: AbstractUser, project: Project | None = None) -> list[AgentRow]:
    """The agents the user can see with their number of runs, the newest run's status and the
    newest recorded train score, in three queries whatever the number of agents.

    A rollback since that score moves the score with the files: after a rollback to evo-K it is
    the train score measured on evo-K's files (cycle K+1 solves with them), or cycle K's when
    no cycle measured them; `rolled_back_to` names the tag."""
    runs = EvolutionRun.objects.filter(agent=OuterRef("pk")).order_by("-created_at", "-id")
    scored = Cycle.objects.filter(run__agent=OuterRef("pk"), score__isnull=False).order_by(
        "-run__created_at", "-run_id", "-number")
    visible = agents_for_user(user) if project is None else agents_for_user(user).filter(project=project)
    # Annotated rows, given rolled_back_to below (and last_run_label by presenters.last_run_labels_set).
    agents = cast("list[AgentRow]", list(visible.annotate(
        run_count=Count("runs", distinct=True),
        last_run_status=Subquery(runs.values("status")[:1]),
        last_run_id=Subquery(runs.values("pk")[:1]),
        last_run_number=Subquery(runs.values("number")[:1]),
        latest_score=Subquery(scored.values("score")[:1]),
        latest_scored_at=Subquery(scored.values("created_at")[:1]),
    ).order_by("project__name", "name", "pk")))
    rollbacks: dict[int, tuple[Any, int]] = {}
    for event in Event.objects.filter(subject_type="agent", subject_id__in=[a.pk for a in agents],
                                      kind="agent.rolled_back").order_by("-id"):
        tag = ROLLBACK_TAG.search(str(event.payload.get("tag") or event.payload.get("message", "")))
        if tag and event.subject_id not in rollbacks:
            rollbacks[event.subject_id] = (event.created_at, int(tag.group(1)))
    for agent in agents:
        agent.rolled_back_to = ""
        rollback = rollbacks.get(agent.pk)
        if rollback and (agent.latest_scored_at is None or rollback[0] > agent.latest_scored_at):
            agent.rolled_back_to = f"evo-{rollback[1]}"
    wanted = {(agent.pk, number) for agent in agents if agent.rolled_back_to
              for number in (int(agent.rolled_back_to[4:]), int(agent.rolled_back_to[4:]) + 1)}
    measured: dict[tuple[int, int], float | None] = {}
    if wanted:
        for agent_id, number, score in Cycle.objects.filter(
                run__agent_id__in={pk for pk, _ in wanted}, number__in={n for _, n in wanted},
                score__isnull=False).order_by("run__created_at", "run_id").values_list(
                "run__agent_id", "number", "score"):
            measured[(agent_id, number)] = score  # cycle numbers are the agent's: one row each
    for agent in agents:
        if agent.rolled_back_to:
            number = int(agent.rolled_back_to[4:])
            agent.latest_score = measured.get((agent.pk, number + 1), measured.get((agent.pk, number)))
    return agents


def agent_for_user(user: AbstractUser, agent_id: int) -> Agent:
    agent = agents_for_user(user).filter(pk=agent_id).first()
    if agent is None:
        raise Http404("No such agent.")
    return agent


def agent_manifest(agent: Agent) -> dict[str, Any]:
    """The manifest as it is on disk now: {"manifest": Manifest, "warnings": [Problem]} (the
    keys it holds that Crucible does not use) or {"error": text}."""
    try:
        return {"manifest": workspace_manifest(agent.path), "error": "",
                "manifest_warnings": manifest_warnings(agent.path)}
    except (WorkspaceError, OSError) as error:
        return {"manifest": None, "error": str(error), "manifest_warnings": []}


def files_unused(root: str | Path, *, prompt_from: str | None = None,
                 manifest_text: str | None = None) -> list[workspace.Problem]:
    """Each file of the workspace at `root` that Crucible will not use, with the reason
    (`workspace.workspace_unused`); `manifest_text` stands in for a manifest the folder does not
    have yet (its import preview's). An agent that runs its own program (a command agent, an
    agent class) may read any file, so those files are one entry saying so instead."""
    runs_as = ""
    if manifest_text is None:
        runs_as = str(agent_mapping(root).get("runs_as", ""))
        try:
            layers: list[str] = list(workspace_manifest(root).evolvable_layers)
        except (WorkspaceError, OSError):
            layers = []
    else:
        try:
            data = yaml.safe_load(manifest_text)
        except yaml.YAMLError:
            data = None
        found = data.get("evolvable_layers") if isinstance(data, dict) else None
        layers = [str(layer) for layer in found] if isinstance(found, list) else []
    unused = workspace.workspace_unused(root, layers=layers, prompt_from=prompt_from)
    if unused and (runs_as == "Crucible command agent" or runs_as.startswith("agent class")):
        shown = ", ".join(entry.path for entry in unused[:8]) + (" …" if len(unused) > 8 else "")
        return [workspace.Problem(".", None, None, f"the agent runs its own program ({runs_as}), which may "
                                  f"read any file of the workspace; no other part of Crucible reads these: "
                                  f"{shown}")]
    return unused


def import_preview(user: AbstractUser, project: Project, path: str, *,
                   trusted: bool = False) -> ImportPreview:
    """What importing the folder at `path` into `project` would do (`workspace.ImportPreview`):
    for a folder without manifest.yaml, the manifest Crucible infers and the files a confirmed
    import writes into Crucible's copy (never into the folder); for every folder, the files
    Crucible will not use (`unused`). The same checks as the import: an operator of the
    project, and from the web and API a folder under CRUCIBLE_REPO_ROOTS."""
    access.require(user, access.OPERATOR, project)
    resolved = server_path_check(path, trusted=trusted, what="workspace")
    if not resolved.is_dir():
        raise ValidationError({"path": f"{resolved}: no such folder."})
    try:
        preview = workspace_preview(resolved)
        unused = files_unused(resolved, prompt_from=preview.prompt_from,
                              manifest_text=None if preview.has_manifest else preview.manifest)
    except (WorkspaceError, OSError) as error:
        raise ValidationError({"path": str(error)}) from None
    return dataclasses.replace(preview, unused=tuple(unused))


def agent_import_warnings(agent: Agent) -> list[str]:
    """What the agent's import found, as `path: message` lines: the inferred manifest and its
    reasoning, what was not copied, each file Crucible will not use."""
    return [f"{entry.get('path', '')}: {entry.get('message', '')}" for entry in agent.import_warnings or []
            if isinstance(entry, dict)]


def agent_runs_as(agent: Agent) -> dict[str, Any]:
    """What a run of the workspace would run now (agents.agent_mapping): the agent it stands in
    for, its tools' sandboxed equivalents and those not available."""
    try:
        return agent_mapping(agent.path)
    except OSError as error:
        return {"summary": str(error), "tools": [], "unavailable": []}


def agent_versions(agent: Agent) -> dict[str, Any]:
    """The version log (evo-0, pre-evo-1, evo-1 …) or the reason it cannot be read now."""
    try:
        history = EvolutionHistory(agent.path)
        versions, head = history.version_log(), history.head()
    except (WorkspaceError, OSError, KeyError) as error:
        return {"versions": [], "error": str(error), "head": None}
    # Which snapshot HEAD is: a tag on its commit, else the one a rollback commit restored.
    for version in versions:
        version["is_head"] = version["sha"] == head["sha"]
        version["head_files"] = not version["is_head"] and version["tag"] == head["rolled_back_to"]
    head["tags"] = [version["tag"] for version in versions if version["is_head"]]
    return {"versions": versions, "error": "", "head": head}


# ---- runs and cycles


def agent_runs(agent: Agent) -> QuerySet[RunRow]:
    """The agent's runs, newest first, with their number of cycles and the last train score."""
    last = Cycle.objects.filter(run=OuterRef("pk"), score__isnull=False).order_by("-number")
    return EvolutionRun.objects.filter(agent=agent).select_related("started_by").annotate(
        cycle_count=Count("cycles"), last_score=Subquery(last.values("score")[:1]))


def run_for_user(user: AbstractUser, agent_id: int, run_id: int) -> EvolutionRun:
    run = EvolutionRun.objects.select_related("agent__project", "started_by").filter(
        pk=run_id, agent_id=agent_id, agent__project__in=projects_for_user(user)).first()
    if run is None:
        raise Http404("No such evolution run.")
    return run


def run_cycles(run: EvolutionRun) -> list[Cycle]:
    """The run's cycles in order, with how many train observations succeeded out of how many."""
    return list(Cycle.objects.filter(run=run).select_related("decided_by").annotate(
        train_count=Count("observations", filter=Q(observations__split=ObservationRecord.Split.TRAIN)),
        train_successes=Count("observations", filter=Q(observations__split=ObservationRecord.Split.TRAIN,
                                                         observations__success=True)),
    ).order_by("number"))


def cycle_for_user(user: AbstractUser, agent_id: int, run_id: int, number: int) -> Cycle:
    cycle = Cycle.objects.select_related("run__agent__project", "decided_by").filter(
        run_id=run_id, run__agent_id=agent_id, number=number,
        run__agent__project__in=projects_for_user(user)).first()
    if cycle is None:
        raise Http404("No such cycle.")
    return cycle


def cycle_observations(cycle: Cycle, *, failures: bool = False) -> dict[str, Any]:
    """The cycle's observations (train first, then holdout), only the failures when asked, capped."""
    rows = ObservationRecord.objects.filter(cycle=cycle)
    counts = {"all": rows.count(), "failures": rows.filter(success=False).count()}
    if failures:
        rows = rows.filter(success=False)
    shown = list(rows.order_by("-split", "id")[: OBSERVATIONS_MAX + 1])  # train before holdout
    return {"rows": shown[:OBSERVATIONS_MAX], "more": len(shown) > OBSERVATIONS_MAX, "counts": counts,
            "limit": OBSERVATIONS_MAX}


def cycle_diff(agent: Agent, cycle: Cycle) -> dict[str, Any]:
    """The cycle's change as a unified diff: `pre-evo-N..evo-N` (the commits the cycle recorded,
    named by their tags when the tags point at them); for a mutation awaiting review (no evo-N
    yet) `pre-evo-N` against the files on disk, which are what an approval snapshots."""
    number = cycle.number
    base = cycle.pre_commit or f"pre-evo-{number}"
    head = cycle.post_commit or f"evo-{number}"
    labels = {"base": f"pre-evo-{number}", "head": f"evo-{number}"}
    try:
        history = EvolutionHistory(agent.path)
        for key, ref in (("base", base), ("head", head)):
            if ref != labels[key] and _tag_commit(history, labels[key]) != ref:
                labels[key] = short_sha(ref)
        if cycle.status == Cycle.Status.AWAITING_REVIEW:
            text, labels["head"] = history.get_pending_diff(base), "the files on disk (awaiting review)"
            text, truncated = _diff_cut(text)
        else:
            text, truncated = _commit_diff(history, base, head)
    except (WorkspaceError, OSError) as error:
        return {"text": "", **labels, "error": str(error), "truncated": False}
    return {"text": text, **labels, "error": "", "truncated": truncated}


def _diff_cut(text: str) -> tuple[str, bool]:
    """The diff as a page carries it (DIFF_MAX_BYTES, cut before a file), and whether it was cut."""
    if len(text) <= DIFF_MAX_BYTES:
        return text, False
    return text[:DIFF_MAX_BYTES].rsplit("\ndiff --git ", 1)[0] + "\n", True


def _commit_diff(history: EvolutionHistory, base: str, head: str) -> tuple[str, bool]:
    """The cut diff between two refs, kept in the derived cache under their commits' SHAs: the
    diff of two commits never changes, and a moved tag resolves to another key."""
    key = f"workspace-diff:{history.root}:{history._resolve(base)}:{history._resolve(head)}:{DIFF_MAX_BYTES}"
    cached = caches["derived"].get(key)
    if cached is not None:
        return str(cached[0]), bool(cached[1])
    diff = _diff_cut(history.get_workspace_diff(base, head))
    caches["derived"].set(key, diff)
    return diff


def _tag_commit(history: EvolutionHistory, tag: str) -> str | None:
    try:
        return history._resolve(tag)
    except WorkspaceError:
        return None


# ---- the workspace at a tag


def ref_choices(versions: list[dict[str, Any]]) -> list[str]:
    """What the browser may show: the current commit, then the snapshot tags, newest first."""
    return ["HEAD", *reversed([version["tag"] for version in versions])]


def workspace_at(agent: Agent, ref: str, skill: str = "") -> dict[str, Any]:
    """Skills, drafts and memory at `ref` (a value of ref_choices, checked by the caller): the
    skill names, the chosen skill's SKILL.md, and each memory file's entries. No file is shown
    beyond PAGE_FILE_CHARS characters (`truncated`, with its `size` in bytes: the page offers
    the download), and a file over MAX_FILE_BYTES is not read at all."""
    try:
        history = EvolutionHistory(agent.path)
        files = _tree_blobs(history.root, ref, ["skills", "memory"])
    except (WorkspaceError, OSError) as error:
        return {"error": str(error), "skills": [], "drafts": [], "memory": [], "skill": None}
    paths = list(files)
    skills = sorted(m.group(1) for m in map(SKILL_PATH.fullmatch, paths) if m)
    drafts = sorted(m.group(1) for m in map(DRAFT_PATH.fullmatch, paths) if m)
    memory = []
    for category in sorted(m.group(1) for m in map(MEMORY_PATH.fullmatch, paths) if m):
        path = f"memory/{category}.jsonl"
        memory.append(_memory_file(_page_text(history.root, *files[path]), path, category))
    chosen = None
    if skill in skills:
        path = f"skills/{skill}/SKILL.md"
        chosen = {"name": skill, "path": path, **_page_text(history.root, *files[path])}
    return {"error": "", "skills": skills, "drafts": drafts, "memory": memory, "skill": chosen}


def _tree_blobs(root: Path, ref: str, paths: list[str]) -> dict[str, tuple[str, int]]:
    """{path: (blob sha, size)} of the regular files under `paths` at `ref` (symlinks and
    submodules left out), from one `git ls-tree -l`: sizes known before anything is read."""
    listing = workspace_git(root, ["ls-tree", "-r", "-l", "-z", ref, "--", *paths])
    files = {}
    for entry in listing.split(b"\0"):
        meta, _, name = entry.partition(b"\t")
        fields = meta.split()
        if len(fields) == 4 and fields[1] == b"blob" and fields[0] in (b"100644", b"100755"):
            files[name.decode("utf-8", "replace")] = (fields[2].decode(), int(fields[3]))
    return files


def _page_text(root: Path, sha: str, size: int) -> dict[str, Any]:
    """A blob as a page shows it: its first PAGE_FILE_CHARS characters (`truncated` when there is
    more); a blob over MAX_FILE_BYTES is not read (`too_big`)."""
    if size > workspace.MAX_FILE_BYTES:
        return {"text": "", "size": size, "truncated": True, "too_big": True, "shown_chars": 0}
    text = workspace_git(root, ["cat-file", "blob", sha]).decode("utf-8", "replace")
    limit = workspace.PAGE_FILE_CHARS  # read now: bench/a_evolve_workspaces.py tries other limits
    truncated = len(text) > limit
    return {"text": text[:limit], "size": size, "truncated": truncated, "too_big": False,
            "shown_chars": min(len(text), limit)}


def _memory_file(page: dict[str, Any], path: str, category: str) -> dict[str, Any]:
    text = page["text"]
    if page["truncated"] and "\n" in text:
        text = text[:text.rindex("\n")]  # the last line was cut: not shown
    entries = []
    lines = [line for line in text.splitlines() if line.strip()]
    for number, line in enumerate(lines[:MEMORY_MAX_ENTRIES], start=1):
        try:
            value = json.loads(line)
        except ValueError:
            entries.append({"line": number, "text": line, "valid": False})
            continue
        if isinstance(value, dict):
            fields = [(str(key), item if isinstance(item, str) else json.dumps(item, ensure_ascii=False))
                      for key, item in value.items()]
        else:
            fields = [("", json.dumps(value, ensure_ascii=False))]
        entries.append({"line": number, "fields": fields, "valid": True})
    return {"category": category, "path": path, "entries": entries, "total": len(lines),
            "more": len(lines) > MEMORY_MAX_ENTRIES, "truncated": page["truncated"],
            "too_big": page["too_big"], "size": page["size"]}


_UNSAFE_PART = re.compile(r"^(|\.|\.\.)$|\x00")


# ---- every file at any tag, and the diff between any two tags (the file browser and compare pages)

BROWSE_MAX_ENTRIES = 5000  # paths listed for one ref; a workspace is far smaller
_BINARY_SNIFF_BYTES = 8000  # git's own test: a NUL byte in the first 8,000 bytes means binary


def workspace_refs(agent: Agent, versions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the file browser and the compare form may name: HEAD, the snapshot tags newest first
    (evo-2, pre-evo-2, evo-1 …, evo-0), then every other tag of the workspace by name.
    `versions`: the agent_versions the caller already read."""
    try:
        history = EvolutionHistory(agent.path)
        log = history.version_log() if versions is None else versions
        snapshots = [version["tag"] for version in reversed(log)]
        repo = repo_open(history.root)
        try:
            tags = refs_list(repo)["tags"]
        finally:
            repo.close()
    except (WorkspaceError, GitError, OSError, KeyError) as error:
        return {"refs": ["HEAD"], "error": str(error)}
    return {"refs": ["HEAD", *snapshots, *(tag for tag in tags if tag not in snapshots)], "error": ""}


def _ref_commit(root: Path, ref: str) -> str:
    """The commit sha of HEAD or of the tag `ref` (never a branch or sha of the same name):
    what every git command below is given, so no ref text reaches the git CLI."""
    repo = repo_open(root)
    try:
        return ref_resolve(repo, "HEAD" if ref == "HEAD" else f"refs/tags/{ref}")
    finally:
        repo.close()


def _path_parts(path: str) -> list[str]:
    """The parts of a path inside the workspace ([] for its top), or Http404 for one that could
    leave it or reach git's own files: `..`, `.`, empty parts, NUL, a leading `-`, `.git`."""
    path = path[:-1] if path.endswith("/") else path
    if not path:
        return []
    parts = path.split("/")
    if len(path) > 1000 or path.startswith("-") or any(
            _UNSAFE_PART.search(part) or part.lower() == ".git" for part in parts):
        raise Http404("No such file.")
    return parts


def _tree_listing(root: Path, sha: str) -> dict[str, dict[str, Any]]:
    """{path: {"kind": dir | file | symlink | submodule, "sha", "size"}} of every entry of the
    commit's tree, from one `git ls-tree -r -t -l`: sizes known before any file is read."""
    listing = workspace_git(root, ["ls-tree", "-r", "-t", "-l", "-z", "--full-tree", sha])
    kinds = {b"040000": "dir", b"100644": "file", b"100755": "file", b"120000": "symlink",
             b"160000": "submodule"}
    entries: dict[str, dict[str, Any]] = {}
    for entry in listing.split(b"\0")[:BROWSE_MAX_ENTRIES]:
        meta, _, name = entry.partition(b"\t")
        fields = meta.split()
        if len(fields) != 4 or not name:
            continue
        size = int(fields[3]) if fields[3].isdigit() else None
        entries[name.decode("utf-8", "replace")] = {"kind": kinds.get(fields[0], "other"),
                                                    "sha": fields[2].decode(), "size": size}
    return entries


def workspace_browse(agent: Agent, ref: str, path: str = "", *,
                     refs: list[str] | None = None) -> dict[str, Any]:
    """The workspace at `ref` (HEAD or any tag) as a code host shows a repository: a folder's
    entries (folders first), or a file: its text (escaped by the page), or why it is not shown
    (binary, over MAX_FILE_BYTES, a symlink or a submodule), the first PAGE_FILE_CHARS characters
    of a long one; and every path, for the list of all files. Http404 for a ref that is not HEAD
    or a tag, and for a path that is unsafe (see _path_parts) or not there. `refs`: the
    workspace_refs the caller already has."""
    parts = _path_parts(path if isinstance(path, str) else "")
    path = "/".join(parts)
    if ref not in (refs if refs is not None else workspace_refs(agent)["refs"]):
        raise Http404("No such snapshot.")
    try:
        root = EvolutionHistory(agent.path).root
        sha = _ref_commit(root, ref)
        entries = _tree_listing(root, sha)
    except (WorkspaceError, GitError, OSError) as error:
        return {"ref": ref, "path": path, "error": str(error), "kind": "dir", "entries": [], "files": [],
                "crumbs": [], "file": None, "sha": ""}
    found = entries.get(path) if path else {"kind": "dir", "sha": "", "size": None}
    if found is None:
        raise Http404("No such file.")
    crumbs = [{"name": part, "path": "/".join(parts[:index + 1])} for index, part in enumerate(parts)]
    result = {"ref": ref, "sha": sha, "path": path, "error": "", "kind": found["kind"], "crumbs": crumbs,
              "files": sorted(p for p, e in entries.items() if e["kind"] != "dir"), "entries": [],
              "file": None, "name": parts[-1] if parts else ""}
    if found["kind"] == "dir":
        prefix = f"{path}/" if path else ""
        children = [{"name": p[len(prefix):], "path": p, **e} for p, e in entries.items()
                    if p.startswith(prefix) and "/" not in p[len(prefix):]]
        result["entries"] = sorted(children, key=lambda e: (e["kind"] != "dir", e["name"]))
    elif found["kind"] == "file":
        result["file"] = _browse_file(root, found["sha"], found["size"] or 0, path)
    return result


def _browse_file(root: Path, sha: str, size: int, path: str) -> dict[str, Any]:
    if size > workspace.MAX_FILE_BYTES:
        return {"path": path, "size": size, "too_big": True, "binary": False, "truncated": True,
                "lines": [], "shown_chars": 0}
    data = workspace_git(root, ["cat-file", "blob", sha])
    if b"\0" in data[:_BINARY_SNIFF_BYTES]:
        return {"path": path, "size": size, "too_big": False, "binary": True, "truncated": False,
                "lines": [], "shown_chars": 0}
    text = data.decode("utf-8", "replace")
    limit = workspace.PAGE_FILE_CHARS
    truncated = len(text) > limit
    shown = text[:limit]
    return {"path": path, "size": size, "too_big": False, "binary": False, "truncated": truncated,
            "lines": shown.split("\n")[:-1] if shown.endswith("\n") else shown.split("\n"),
            "shown_chars": len(shown)}


def workspace_file_bytes(agent: Agent, ref: str, path: str) -> tuple[str, bytes]:
    """(file name, bytes) of the regular file `path` at `ref` (HEAD or any tag), for a download;
    Http404 as workspace_browse, and for a symlink, a submodule, a folder or a file over
    MAX_WORKSPACE_BYTES."""
    parts = _path_parts(path if isinstance(path, str) else "")
    if not parts or ref not in workspace_refs(agent)["refs"]:
        raise Http404("No such file.")
    try:
        root = EvolutionHistory(agent.path).root
        found = _tree_listing(root, _ref_commit(root, ref)).get("/".join(parts))
        if found is None or found["kind"] != "file" or (found["size"] or 0) > workspace.MAX_WORKSPACE_BYTES:
            raise Http404("No such file.")
        return parts[-1], workspace_git(root, ["cat-file", "blob", found["sha"]])
    except (WorkspaceError, GitError, OSError):
        raise Http404("No such file.") from None


def workspace_compare(agent: Agent, base: str, head: str) -> dict[str, Any]:
    """The unified diff from `base` to `head` (each HEAD or any tag, checked by the caller against
    workspace_refs), with the paths it changes; the first DIFF_MAX_BYTES of a large one."""
    empty = {"text": "", "base": base, "head": head, "truncated": False, "files": [], "base_sha": "",
             "head_sha": ""}
    try:
        root = EvolutionHistory(agent.path).root
        base_sha, head_sha = _ref_commit(root, base), _ref_commit(root, head)
        text = workspace_git(root, ["diff", *_DIFF_OPTIONS, base_sha, head_sha, "--"]).decode(
            "utf-8", "replace")
        changed = workspace_git(root, ["diff", "--name-status", "--no-renames", "-z", base_sha, head_sha,
                                       "--"])
    except (WorkspaceError, GitError, OSError) as error:
        return {**empty, "error": str(error)}
    fields = changed.split(b"\0")
    files = [{"status": {"A": "added", "D": "deleted"}.get(fields[i].decode()[:1], "modified"),
              "path": fields[i + 1].decode("utf-8", "replace")} for i in range(0, len(fields) - 1, 2)]
    truncated = len(text) > DIFF_MAX_BYTES
    if truncated:
        text = text[:DIFF_MAX_BYTES].rsplit("\ndiff --git ", 1)[0] + "\n"
    return {**empty, "text": text, "truncated": truncated, "files": files, "error": "",
            "base_sha": base_sha, "head_sha": head_sha}


# ---- runs by their number (what the pages' URLs carry; a run's database id still finds it)


def run_by_number_for_user(user: AbstractUser, agent_id: int, number: int) -> tuple[EvolutionRun, bool]:
    """(run, found by its id): the agent's run `number`; else, for links made before the pages
    named runs by number, its run whose database id is `number` (the page then redirects)."""
    runs = EvolutionRun.objects.select_related("agent__project", "started_by").filter(
        agent_id=agent_id, agent__project__in=projects_for_user(user))
    run = runs.filter(number=number).first()
    if run is not None:
        return run, False
    run = runs.filter(pk=number).first()
    if run is None:
        raise Http404("No such evolution run.")
    return run, True


def cycle_by_number_for_user(user: AbstractUser, agent_id: int, run_number: int, number: int) -> Cycle:
    """Cycle `number` of the agent's run `run_number` (or of the run with that id, as above)."""
    run, _ = run_by_number_for_user(user, agent_id, run_number)
    return cycle_of_run(run, number)


def cycle_of_run(run: EvolutionRun, number: int) -> Cycle:
    """Cycle `number` of a run already found for the user (it keeps that run object)."""
    cycle = Cycle.objects.select_related("decided_by").filter(run=run, number=number).first()
    if cycle is None:
        raise Http404("No such cycle.")
    cycle.run = run
    return cycle


# ---- reads by id (the pages nest runs under agents; the API and the CLI name them directly)

CYCLE_FIELDS = (
    "id", "number", "status", "score", "holdout_score", "holdout_after", "mutated", "summary",
    "engine_metadata", "skills_added", "skills_modified", "skills_deleted", "prompt_size_change",
    "reverted_paths", "pre_commit", "post_commit", "reason", "created_at", "finished_at",
)




def runs_for_user(user: AbstractUser) -> QuerySet[EvolutionRun]:
    return EvolutionRun.objects.select_related("agent__project", "started_by").filter(
        agent__project__in=projects_for_user(user))


def run_by_id_for_user(user: AbstractUser, run_id: int) -> EvolutionRun:
    run = runs_for_user(user).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such evolution run.")
    return run


def cycle_by_id_for_user(user: AbstractUser, cycle_id: int) -> Cycle:
    cycle = Cycle.objects.select_related("run__agent__project").filter(
        pk=cycle_id, run__agent__project__in=projects_for_user(user)).first()
    if cycle is None:
        raise Http404("No such cycle.")
    return cycle


def cycle_report(cycle: Cycle) -> dict[str, Any]:
    report = {name: getattr(cycle, name) for name in CYCLE_FIELDS}
    report["decided_by"] = cycle.decided_by.get_username() if cycle.decided_by is not None else None
    report["train_count"] = getattr(cycle, "train_count", None)
    report["train_successes"] = getattr(cycle, "train_successes", None)
    return report


def _cycles_done(run: EvolutionRun) -> int:
    """Its recorded cycles: annotated by agent_runs (`cycle_count`), else counted."""
    counted = run.__dict__.get("cycle_count")
    return counted if counted is not None else run.cycles.count()


def run_summary(run: EvolutionRun) -> dict[str, Any]:
    return {
        "id": run.pk, "number": run.number, "agent_id": run.agent_id, "agent": run.agent.name,
        "project_id": run.agent.project_id,
        "benchmark": run.benchmark, "engine": run.engine, "config": run.config,
        "agent_mapping": run.agent_mapping or {}, "driver": run.driver,
        "cycles_planned": run.cycles_planned, "status": run.status, "converged": run.converged,
        "status_info": run_status(run, _cycles_done(run)).as_dict(),
        "reason": run.reason,
        "started_by": run.started_by.get_username() if run.started_by is not None else None,
        "created_at": run.created_at, "finished_at": run.finished_at,
    }


def run_report(run: EvolutionRun) -> dict[str, Any]:
    """The run and its cycles (scores, decisions, what each changed) and its score curve: what
    `GET /api/runs/{id}` and `manage.py evolve status RUN --json` print."""
    cycles = run_cycles(run)
    return {**run_summary(run), "cycles": [cycle_report(cycle) for cycle in cycles],
            "score_curve": [[cycle.number, cycle.score] for cycle in cycles if cycle.score is not None]}


def agent_summary(agent: Agent) -> dict[str, Any]:
    """The agent as the API and the CLI's --json show it: `path` is Crucible's copy,
    `source_path` the folder it was imported from, `import_warnings` what its import found."""
    return {"id": agent.pk, "project_id": agent.project_id, "project": agent.project.name, "name": agent.name,
            "path": agent.path, "source_path": agent.source_path, "agent_type": agent.agent_type,
            "created_at": agent.created_at, "import_warnings": agent_import_warnings(agent)}


def agent_report(agent: Agent) -> dict[str, Any]:
    """The agent, its version log from git (evo-0, pre-evo-1, evo-1 …), its runs and the score
    curve of every cycle of every run, oldest first."""
    versions = agent_versions(agent)
    runs = list(agent_runs(agent))
    cycles = Cycle.objects.filter(run__agent=agent, score__isnull=False).order_by(
        "run__created_at", "run_id", "number").values_list("run_id", "number", "score", "status")
    return {
        **agent_summary(agent),
        "versions": versions["versions"], "versions_error": versions["error"],
        "runs": [{**run_summary(run), "cycle_count": run.cycle_count, "last_score": run.last_score}
                 for run in runs],
        "score_curve": [{"run": run_id, "cycle": number, "score": score, "status": status}
                        for run_id, number, score, status in cycles],
    }


# ---- the project page (runtime_app/subjects.py project_section_register)


def project_agents_section(user: AbstractUser, project: Project) -> ProjectSection:
    """The project's agents with their score and last run, and what needs someone: mutations
    awaiting an approver, runs that failed (an agent's latest), and runs queued or running."""
    agents = agent_list_rows(user, project)
    last_run_labels_set(agents, last_run_statuses(agents))
    status = EvolutionRun.Status
    levels: dict[str | None, str] = {status.AWAITING_REVIEW: "awaiting approval", status.FAILED: "failed",
                                     status.QUEUED: "running", status.RUNNING: "running"}
    attention = []
    noted = [agent for agent in agents if agent.last_run_status in levels]
    runs = EvolutionRun.objects.only("pk", "number", "reason", "created_at", "finished_at").in_bulk(
        [agent.last_run_id for agent in noted])
    for agent in noted:
        level, run = levels[agent.last_run_status], runs[agent.last_run_id]
        what = {"awaiting approval": "a mutation awaits an approver", "failed": f"failed: {run.reason}",
                "running": f"is {agent.last_run_label}"}[level]
        attention.append(Attention(level, f"{agent.name}: run {run.number} {what}",
                                   reverse("evolution_run_detail", args=[agent.pk, run.number]),
                                   when=run.finished_at or run.created_at))
    return ProjectSection("agents", "Agents", "evolve_app/_project_section.html", {"agents": agents},
                          attention)
