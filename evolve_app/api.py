"""REST routes of evolve_app: import agents, start, follow, cancel and decide on evolution runs,
roll agents back. The same services and selectors as the pages and `manage.py evolve`.

Access: an object of a project the caller is not a member of answers 404 (outsiders learn
nothing); a missing role answers 403; bad input answers 400 (the services' messages) or 422
(a body that does not fit the schema).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import Http404
from ninja import Field, Router, Schema, Status

from evolve_app import selectors, services
from evolve_app.models import Cycle
from evolve_app.selectors import (
    agent_report,
    agent_summary,
    cycle_by_id_for_user,
    cycle_report,
    run_by_id_for_user,
    run_report,
)
from evolve_app.types import AuthedRequest
from runtime_app.api import StatusOut
from runtime_app.selectors import project_for_reference

router = Router(tags=["evolve"])


# ---- schemas


class AgentBase(Schema):
    id: int
    project_id: int
    project: str
    name: str
    path: str = Field(description="Crucible's copy of the folder, where runs, snapshots and rollbacks happen")
    source_path: str = Field("", description="the folder it was imported from, which is never written "
                                             "(blank for agents imported in place before copies existed)")
    agent_type: str
    created_at: datetime
    import_warnings: list[str] = Field(default_factory=list, description=(
        "`path: message` for what the import found: the manifest it inferred and why, what it did not "
        "copy, and each file Crucible will not use, with the reason"))


class AgentOut(AgentBase):
    run_count: int = 0
    last_run_id: int | None = None
    last_run_number: int | None = None
    last_run_status: str | None = None
    latest_score: float | None = None


class AgentVersionOut(Schema):
    tag: str
    sha: str
    message: str
    date: datetime
    cycle: int
    kind: str
    is_head: bool = Field(False, description="HEAD is this snapshot's commit")
    head_files: bool = Field(False, description="HEAD is a rollback commit that restored this snapshot")


class RunSummaryOut(Schema):
    id: int
    number: int = Field(description="the agent's own count of its runs: run 1, 2, 3 …")
    agent_id: int
    agent: str
    project_id: int
    benchmark: str
    engine: str
    config: dict[str, Any]
    agent_mapping: dict[str, Any] = Field(
        default_factory=dict, description="what the workspace's agent runs as: `summary`, `agent`, "
                                          "`a_evolve`, `runs_as`, `preset`/`model`, `tools` [{name, tool, "
                                          "as}], `unavailable` [{name, why}]")
    driver: str = Field("worker", description="`worker`, or `script`: a Python script through "
                                              "crucible.aevolve drives its cycles in its own process")
    cycles_planned: int
    status: str = Field(description="the run's own state (status_info is what people read)")
    status_info: StatusOut
    converged: bool
    reason: str
    started_by: str | None
    created_at: datetime
    finished_at: datetime | None


class AgentRunOut(RunSummaryOut):
    cycle_count: int
    last_score: float | None


class CurvePointOut(Schema):
    run: int
    cycle: int
    score: float
    status: str


class AgentDetailOut(AgentBase):
    versions: list[AgentVersionOut]
    versions_error: str = Field(description="why the version log cannot be read now, if it cannot")
    runs: list[AgentRunOut]
    score_curve: list[CurvePointOut]


class CycleOut(Schema):
    id: int
    number: int
    status: str
    score: float | None
    holdout_score: float | None
    holdout_after: float | None
    mutated: bool
    summary: str
    engine_metadata: dict[str, Any]
    skills_added: list[str]
    skills_modified: list[str]
    skills_deleted: list[str]
    prompt_size_change: int
    reverted_paths: list[str]
    pre_commit: str
    post_commit: str
    reason: str
    decided_by: str | None
    train_count: int | None = None
    train_successes: int | None = None
    created_at: datetime
    finished_at: datetime | None


class EvolutionRunOut(RunSummaryOut):
    cycles: list[CycleOut]
    score_curve: list[tuple[int, float]]


class ObservationOut(Schema):
    id: int
    split: str
    task_id: str
    task_input: str
    agent_output: str
    steps: list[Any]
    success: bool
    score: float
    feedback_detail: str


class ObservationsOut(Schema):
    run_id: int
    cycle: int
    failures_only: bool
    counts: dict[str, int] = Field(description="all and failures, before the filter and the cap")
    limit: int
    more: bool = Field(description="more observations than the limit matched")
    observations: list[ObservationOut]


class ImportIn(Schema):
    project: int | str = Field(..., description="the project's id or name")
    path: str = Field(..., max_length=1000, description="the workspace folder's absolute path on the server")
    name: str = Field("", max_length=96, description="defaults to the manifest's name")
    manifest: str | None = Field(None, max_length=256 * 1024,
                                 description="for a folder without manifest.yaml: the manifest of its "
                                             "preview (POST /api/agents/preview), as is or edited; written "
                                             "into Crucible's copy only, never into the folder")
    infer: bool = Field(False, description="for a folder without manifest.yaml: import it with the manifest "
                                           "Crucible infers (the CLI's --accept-inferred); it and its "
                                           "reasoning come back in `import_warnings`")


class AgentImportOut(AgentOut):
    warnings: list[str] = Field(description="`file:line:column: message` for each manifest key kept but "
                                            "not used (A-Evolve ignores them too); never a refusal")
    note: str = Field("", description="set when the folder was already imported into this project: "
                                      "the existing agent is returned and nothing is copied again")


class PreviewIn(Schema):
    project: int | str = Field(..., description="the project's id or name")
    path: str = Field(..., max_length=1000, description="the workspace folder's absolute path on the server")


class PreviewOut(Schema):
    path: str
    has_manifest: bool = Field(description="the folder has its own manifest.yaml (then `manifest` is it)")
    manifest: str = Field(description="the inferred manifest.yaml to confirm or edit, or the folder's own")
    prompt_from: str | None = Field(description="the file a confirmed import copies to prompts/system.md")
    writes: list[str] = Field(description="the files a confirmed import adds to Crucible's copy of the "
                                          "folder (never to the folder itself)")
    notes: list[str]
    problems: list[str] = Field(description="what would refuse the import even with this manifest")
    warnings: list[str]
    unused: list[str] = Field(description="`path: reason` for each file Crucible will not use")


class RunIn(Schema):
    benchmark: str = Field("demo", max_length=500,
                           description="a registered name, or folder:PATH / jsonl:PATH under "
                                       "CRUCIBLE_REPO_ROOTS")
    engine: str = Field("textbook", max_length=200,
                        description="a registered engine name (a dotted path only if "
                                    "CRUCIBLE_ALLOWED_EXTENSIONS lists it)")
    cycles: int = Field(5, description="1 to 200; a run stops early when it converges")
    config: dict[str, Any] | None = Field(None, description="EvolveConfig: batch_size, holdout_size, …")


class DecideIn(Schema):
    approve: bool


class RollbackIn(Schema):
    tag: str = Field(..., max_length=20, description="a snapshot tag such as evo-3")


class RollbackOut(Schema):
    agent_id: int
    tag: str
    commit: str


# ---- routes




@router.get("/agents", response=list[AgentOut])
def agent_list(request: AuthedRequest) -> list[dict[str, Any]]:
    """The agents of the caller's projects, with their runs, last status and latest score."""
    return [{**agent_summary(agent), "run_count": agent.run_count, "last_run_id": agent.last_run_id,
             "last_run_number": agent.last_run_number,
             "last_run_status": agent.last_run_status, "latest_score": agent.latest_score}
            for agent in selectors.agent_list_rows(request.user)]


@router.post("/agents/preview", response=PreviewOut)
def agent_import_preview(request: AuthedRequest, body: PreviewIn) -> dict[str, Any]:
    """What importing a folder under CRUCIBLE_REPO_ROOTS would do. A folder without manifest.yaml
    gets the manifest Crucible infers (agent type, layers, where the prompt is) and the files a
    confirmed import writes: pass `manifest` (as is or edited) to POST /api/agents/import."""
    project = project_for_reference(request.user, body.project)
    preview = selectors.import_preview(request.user, project, body.path)
    return {**{name: getattr(preview, name) for name in ("path", "has_manifest", "manifest", "prompt_from")},
            "writes": list(preview.writes), "notes": list(preview.notes),
            "problems": [str(problem) for problem in preview.problems],
            "warnings": [str(warning) for warning in preview.warnings],
            "unused": [str(entry) for entry in preview.unused]}


@router.post("/agents", response={201: AgentImportOut})
def agent_create(request: AuthedRequest, body: ImportIn) -> Status[dict[str, Any]]:
    """The same as POST /api/agents/import (creating an agent is importing a copy of a folder)."""
    return agent_import(request, body)


@router.post("/agents/import", response={201: AgentImportOut})
def agent_import(request: AuthedRequest, body: ImportIn) -> Status[dict[str, Any]]:
    """Import a copy of a workspace folder under CRUCIBLE_REPO_ROOTS (the folder is never
    written); every problem comes back with its file and line (`errors.path`), manifest keys
    Crucible does not use as `warnings`, what the import found (the manifest it inferred, files
    Crucible will not use) as `import_warnings`. Importing the same folder into the same
    project again returns its agent with a `note`. A folder without manifest.yaml imports with
    the manifest Crucible infers, or `manifest` (its preview, POST /api/agents/preview, edited)."""
    project = project_for_reference(request.user, body.project)
    agent = services.agent_import(request.user, project, body.path, body.name, manifest=body.manifest,
                                  infer=body.infer)
    warnings = selectors.agent_manifest(agent)["manifest_warnings"]
    return Status(201, {**agent_summary(agent), "warnings": [str(warning) for warning in warnings],
                        "note": agent.import_note})


@router.get("/agents/{agent_id}", response=AgentDetailOut)
def agent_detail(request: AuthedRequest, agent_id: int) -> dict[str, Any]:
    return agent_report(selectors.agent_for_user(request.user, agent_id))


@router.post("/agents/{agent_id}/runs", response={202: EvolutionRunOut})
def run_start(request: AuthedRequest, agent_id: int, body: RunIn) -> Status[dict[str, Any]]:
    """Queue an evolution run for the workers (one run at a time per agent). Engines, benchmarks
    and the workspace's agent type are checked by name; nothing named here is imported."""
    agent = selectors.agent_for_user(request.user, agent_id)
    run = services.evolution_run_start(request.user, agent, benchmark=body.benchmark, engine=body.engine,
                                       cycles=body.cycles, config=body.config)
    return Status(202, run_report(run))


@router.post("/agents/{agent_id}/rollback", response=RollbackOut)
def agent_rollback(request: AuthedRequest, agent_id: int, body: RollbackIn) -> dict[str, Any]:
    """A new commit whose files equal the snapshot `tag`'s; history is kept."""
    agent = selectors.agent_for_user(request.user, agent_id)
    sha = services.agent_rollback(request.user, agent, body.tag)
    return {"agent_id": agent.pk, "tag": body.tag, "commit": sha}


@router.get("/runs/{run_id}", response=EvolutionRunOut)
def run_detail(request: AuthedRequest, run_id: int) -> dict[str, Any]:
    """The run and every cycle recorded so far, with scores and what each changed."""
    return run_report(run_by_id_for_user(request.user, run_id))


@router.get("/runs/{run_id}/cycles/{number}/observations", response=ObservationsOut)
def cycle_observations(request: AuthedRequest, run_id: int, number: int,
                       failures: bool = False,
                       split: Literal["train", "holdout"] | None = None) -> dict[str, Any]:
    """The cycle's observations (train first, then holdout); `failures=true` keeps the failed ones."""
    run = run_by_id_for_user(request.user, run_id)
    cycle = Cycle.objects.filter(run=run, number=number).first()
    if cycle is None:
        raise Http404(f"Run {run.number} has no cycle {number}.")
    found = selectors.cycle_observations(cycle, failures=failures)
    rows = [row for row in found["rows"] if split is None or row.split == split]
    return {"run_id": run.pk, "cycle": cycle.number, "failures_only": failures, "counts": found["counts"],
            "limit": found["limit"], "more": found["more"], "observations": rows}


@router.post("/runs/{run_id}/cancel", response=EvolutionRunOut)
def run_cancel(request: AuthedRequest, run_id: int) -> dict[str, Any]:
    """Stop a queued, running or waiting run; a running one stops after its current cycle."""
    run = services.evolution_run_cancel(request.user, run_by_id_for_user(request.user, run_id))
    return run_report(run_by_id_for_user(request.user, run.pk))


@router.post("/cycles/{cycle_id}/decide", response=CycleOut)
def cycle_decide(request: AuthedRequest, cycle_id: int, body: DecideIn) -> dict[str, Any]:
    """Review mode: an approver accepts the waiting mutation (the run goes on) or rejects it."""
    cycle = cycle_by_id_for_user(request.user, cycle_id)
    decided = services.cycle_decide(request.user, cycle, body.approve)
    return cycle_report(decided)
