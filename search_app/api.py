"""REST routes of search_app: validate, save and freeze specs with the same services."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest
from ninja import Field, Router, Schema, Status

from runtime_app.api import StatusOut
from runtime_app.metrics import metric_source
from runtime_app.selectors import project_for_user, repository_for_user
from search_app import diffs, selectors, services
from search_app.execution import search_spec
from search_app.preflight import provider_problems, search_path_warnings
from search_app.presenters import runnable_context
from search_app.spec import spec_validate, spec_warnings
from search_app.status import search_status_of, search_statuses

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from search_app.models import Search

router = Router(tags=["search"])


class AuthenticatedHttpRequest(HttpRequest):
    """A request the API's auth let in (a token or a session): a signed-in person's. Defined at
    run time because ninja reads the endpoints' annotations."""

    user: User


class SpecText(Schema):
    text: str = Field(..., description="the spec's TOML")


class SpecCheckIn(SpecText):
    repository_id: int | None = Field(None, description="also check it against this repository's baseline")
    ref: str = Field("HEAD", description="the baseline with repository_id: a branch, tag, HEAD or sha")


class SpecErrorOut(Schema):
    line: int
    column: int
    path: str
    message: str
    expected: str
    suggestion: str
    text: str = Field(description="the error as one line, as the CLI prints it")


class ValidationOut(Schema):
    valid: bool
    errors: list[SpecErrorOut]
    summary: dict[str, Any] | None
    warnings: list[str] = Field(
        default_factory=list, description="what a valid spec allows but a person should know before "
        "freezing it (\"nothing checks correctness while the score runs\" without `score.results`)")
    freeze_problems: list[str] = Field(
        default_factory=list, description="with repository_id: why freezing against that baseline would be "
        "refused (a file a command names is not there, the provider has no key)")
    freeze_warnings: list[str] = Field(
        default_factory=list, description="with repository_id: files a command names that only an earlier "
        "step may make")


class SpecIn(Schema):
    project_id: int
    title: str
    text: str


class SpecVersionOut(Schema):
    number: int
    valid: bool
    created_at: datetime
    text: str


class SpecOut(Schema):
    id: int
    project_id: int
    title: str
    duplicated_from_id: int | None
    versions: list[SpecVersionOut]


class DiffOut(Schema):
    diff: str


class FreezeIn(Schema):
    project_id: int
    repository_id: int
    ref: str
    text: str | None = Field(None, description="the spec's TOML; or give spec_id")
    spec_id: int | None = Field(None, description="freeze the latest version of a saved spec")


class SearchOut(Schema):
    search_id: str
    preregistration_hash: str
    project_id: int
    name: str
    objective: str
    repository_path: str
    ref: str
    baseline_commit: str
    requested_model_id: str
    resolved_model_id: str
    model_resolution: str
    public_evidence_hash: str
    evaluator_hash: str
    candidate_batches: list[list[str]]
    hashed_inputs: dict[str, Any]
    created_at: datetime


def _validation(text: str) -> dict[str, Any]:
    report = spec_validate(text)
    summary = report.summary()
    if summary is not None and report.spec is not None:  # (a summary is there when the spec is)
        summary["metric_source"] = metric_source(report.spec.score.metric, report.spec.score.reported)
    return {
        "valid": report.valid,
        "errors": [{**error.as_dict(), "text": str(error)} for error in report.errors],
        "summary": summary,
        "warnings": report.warnings,
    }


def _spec_out(spec) -> dict[str, Any]:
    return {
        "id": spec.pk, "project_id": spec.project_id, "title": spec.title,
        "duplicated_from_id": spec.duplicated_from_id, "versions": list(spec.versions.all()),
    }


@router.post("/specs/validate", response=ValidationOut)
def spec_validate_route(request: HttpRequest, body: SpecCheckIn):
    """Every error at once, with line:column, key path, what was expected and a suggestion; with
    `repository_id`, also what freezing against its `ref` would refuse (as the editor shows)."""
    validation = _validation(body.text)
    if body.repository_id is not None:
        repository = repository_for_user(request.user, body.repository_id)
        report = spec_validate(body.text)
        if report.spec is not None and report.valid:
            runnable = runnable_context(report.spec, repository, body.ref.strip() or "HEAD")
            validation.update(freeze_problems=runnable["problems"], freeze_warnings=runnable["warnings"])
    return validation


@router.post("/specs", response={201: SpecOut})
def spec_create(request: AuthenticatedHttpRequest, body: SpecIn):
    project = project_for_user(request.user, body.project_id)
    return Status(201, _spec_out(services.spec_create(request.user, project, body.title, body.text)))


@router.get("/specs", response=list[SpecOut])
def spec_list(request: HttpRequest):
    return [_spec_out(spec) for spec in selectors.specs_for_user(request.user).prefetch_related("versions")]


@router.get("/specs/{spec_id}", response=SpecOut)
def spec_detail(request: HttpRequest, spec_id: int):
    return _spec_out(selectors.spec_for_user(request.user, spec_id))


@router.post("/specs/{spec_id}/versions", response={201: SpecVersionOut})
def spec_save(request: AuthenticatedHttpRequest, spec_id: int, body: SpecText):
    spec = selectors.spec_for_user(request.user, spec_id)
    return Status(201, services.spec_save(request.user, spec, body.text))


@router.post("/specs/{spec_id}/duplicate", response={201: SpecOut})
def spec_duplicate(request: AuthenticatedHttpRequest, spec_id: int):
    spec = selectors.spec_for_user(request.user, spec_id)
    return Status(201, _spec_out(services.spec_duplicate(request.user, spec)))


@router.get("/specs/{spec_id}/diff", response=DiffOut)
def spec_diff(request: HttpRequest, spec_id: int, old: int, new: int):
    """Unified diff between versions `old` and `new` of a spec."""
    spec = selectors.spec_for_user(request.user, spec_id)
    return {"diff": diffs.spec_diff(
        selectors.spec_version_get(spec, old), selectors.spec_version_get(spec, new)
    )}


def _search_fields(search: Search) -> dict[str, Any]:
    return {field: getattr(search, field) for field in SearchOut.model_fields}


class SearchFrozenOut(SearchOut):
    provider_warnings: list[str] = Field(
        description="why its writers could not reach their model now (no key, no server); "
                    "starting it will ask for start_anyway")
    warnings: list[str] = Field(
        default_factory=list, description="what the frozen spec allows but a person should know "
        "(\"nothing checks correctness while the score runs\" without `score.results`)")


@router.post("/searches", response={201: SearchFrozenOut})
def search_freeze(request: AuthenticatedHttpRequest, body: FreezeIn):
    """Freeze a spec against a registered repository's ref; the same inputs give the same id."""
    project = project_for_user(request.user, body.project_id)
    repository = repository_for_user(request.user, body.repository_id)
    version = None
    if body.spec_id is not None:
        version = selectors.spec_for_user(request.user, body.spec_id).latest
        if version is None:
            raise Http404("That spec has no saved text.")
        text = version.text
    elif body.text is not None:
        text = body.text
    else:
        raise ValidationError({"text": "Give the spec's text or a saved spec's id."})
    search = services.search_freeze(
        request.user, project, text, body.ref, repository=repository, spec_version=version
    )
    spec = search_spec(search)
    warnings = [*spec_warnings(spec), *search_path_warnings(search)]
    return Status(201, {**_search_fields(search), "warnings": warnings,
                        "provider_warnings": provider_problems(spec.worker.provider)})


class SearchDetailOut(SearchOut):
    status_info: StatusOut


class SearchListItemOut(SearchOut):
    status: str = Field(description="the run's own state: not started, queued, running, cancelling, "
                                    "cancelled or finished (status_info is what people read)")
    outcome: str = Field(description="winner or NONE once finished; empty before")
    status_info: StatusOut


# The `status` filter's values (as on the searches page) and the outcomes.
if TYPE_CHECKING:  # built from the selectors' constants at run time, which a checker cannot read
    SearchStatusFilter = str
    SearchOutcomeFilter = str
else:
    SearchStatusFilter = Literal[tuple(selectors.SEARCH_LIST_STATUSES)]
    SearchOutcomeFilter = Literal[selectors.SEARCH_LIST_OUTCOMES]


@router.get("/searches", response=list[SearchListItemOut])
def search_list(request: HttpRequest, status: SearchStatusFilter | None = None,
                outcome: SearchOutcomeFilter | None = None):
    """The searches of your projects, newest first, each with its status and outcome;
    `status=running` (or not-started, queued, cancelling, cancelled, finished) and
    `outcome=winner` (or none, undecided) filter them."""
    rows = list(selectors.search_list_rows(request.user, status=status or "", outcome=outcome or "")
                .defer(None))  # the list page defers the frozen fields; every item here carries them
    statuses = search_statuses(rows)
    return [{**_search_fields(search),
             "status": search.list_status, "outcome": getattr(getattr(search, "run", None), "outcome", ""),
             "status_info": statuses[search.pk].as_dict()}
            for search in rows]


@router.get("/searches/{search_id}", response=SearchDetailOut)
def search_detail(request: HttpRequest, search_id: str):
    search = selectors.search_for_user(request.user, search_id)
    return {**_search_fields(search), "status_info": search_status_of(search).as_dict()}


class SearchRunOut(Schema):
    search_id: str
    status: str
    detail: str


@router.post("/searches/{search_id}/start", response={202: SearchRunOut})
def search_start(request: AuthenticatedHttpRequest, search_id: str, start_anyway: bool = False):
    """Start a frozen search; workers take it from here. Starting it again changes nothing.
    A provider with no key or no reachable server is a 400 saying so, unless `start_anyway=true`."""
    search = selectors.search_for_user(request.user, search_id)
    try:
        run = services.search_start_checked(request.user, search, start_anyway=start_anyway)
    except services.ProviderUnready as unready:
        raise ValidationError([*unready.messages, "Start it anyway with ?start_anyway=true."]) from None
    return Status(202, {"search_id": search.search_id, "status": run.status,
                        "detail": "Follow it at GET /api/searches/{id}/run or on its page."})


@router.post("/searches/{search_id}/cancel", response={202: SearchRunOut})
def search_cancel(request: AuthenticatedHttpRequest, search_id: str):
    """Cancel a running search: no new steps; running ones stop and their receipts say so."""
    search = selectors.search_for_user(request.user, search_id)
    run = services.search_cancel(request.user, search)
    return Status(202, {"search_id": search.search_id, "status": run.status,
                        "detail": "Running steps are being stopped."})


@router.get("/searches/{search_id}/run", response=dict[str, Any])
def search_run(request: HttpRequest, search_id: str):
    """Status, phase, budget, outcome, and every candidate with its fate and receipt ids.
    `metric` is the score's metric; `metric_source` says who measured it: `runtime`, or the
    label the pages show for a figure the score command reports about itself. `warnings` are the
    frozen spec's ("nothing checks correctness while the score runs" without `score.results`).
    While it runs, `time_left` is the forecast measured on its own finished steps (seconds low,
    middle and high, the worst case from the spec's timeouts, and the text the page shows)."""
    return selectors.search_run_report(selectors.search_for_user(request.user, search_id))


@router.get("/searches/{search_id}/candidates", response=list[dict[str, Any]])
def search_candidates(request: HttpRequest, search_id: str):
    """Every candidate with its fate, score and `metric_source` (as in the run report)."""
    return selectors.search_run_report(selectors.search_for_user(request.user, search_id))["candidates"]


@router.get("/searches/{search_id}/receipts", response=list[dict[str, Any]])
def search_receipts(request: HttpRequest, search_id: str):
    """Every receipt of the search's candidates, oldest first."""
    search = selectors.search_for_user(request.user, search_id)
    return [receipt.as_dict() for receipt in selectors.search_receipts(request.user, search)]


class ForecastSpanOut(Schema):
    low: float
    high: float


class ForecastRoundOut(Schema):
    round: int
    survivors: int
    writer_steps: ForecastSpanOut
    gate_runs: ForecastSpanOut
    trial_runs: ForecastSpanOut
    wall_seconds: ForecastSpanOut | None


class ForecastReplayOut(Schema):
    replays: ForecastSpanOut
    gate_runs: ForecastSpanOut
    trial_runs: ForecastSpanOut
    wall_seconds: ForecastSpanOut | None = Field(None, description="the replays and the review")


class ForecastBudgetOut(Schema):
    max_cost_microusd: int | None
    max_tokens: int | None


class SearchForecastOut(Schema):
    search_id: str
    started: bool = Field(description="whether the search has started (the forecast stays as planned)")
    writer_kind: str = Field(description="`llm` or `command`")
    provider: str
    model: str
    rounds: list[ForecastRoundOut]
    replay: ForecastReplayOut
    writer_steps: ForecastSpanOut
    gate_runs: ForecastSpanOut
    trial_runs: ForecastSpanOut
    model_calls: ForecastSpanOut | None
    cost_microusd: ForecastSpanOut | None = Field(description="null when it cannot be forecast")
    cost_source: str
    tokens: ForecastSpanOut | None
    budget: ForecastBudgetOut
    wall_seconds: ForecastSpanOut | None = Field(description="null without history of this repository")
    wall_typical_seconds: float | None = Field(
        None, description="the middle figure: past steps' median durations over the fewest counts")
    wall_source: str
    wall_ceiling_seconds: float = Field(description="an upper bound from the spec's timeouts")
    wall_ceiling_source: str
    history_searches: int
    notes: list[str]
    warnings: list[str]


@router.get("/searches/{search_id}/forecast", response=SearchForecastOut)
def search_forecast(request: HttpRequest, search_id: str):
    """Planned writer steps, gate and trial runs (as ranges), expected cost and wall time, and
    where each figure comes from: the price table and this repository's past searches' receipts."""
    search = selectors.search_for_user(request.user, search_id)
    return {"search_id": search.search_id, "started": selectors.search_started(search),
            **selectors.search_forecast(search).as_dict()}


# --- comments, decisions and the merge: the doors the candidate, decide and merge pages use ---

class ErrorOut(Schema):
    detail: str = Field(description="what was refused and why, in the words the pages use")
    errors: dict[str, list[str]] | None = Field(None, description="the same messages by field")


# Refusals: 400 bad input or a rule, 403 a missing role, 404 not yours or no such thing,
# 409 the state moved on (a stale patch hash, merged already).
REFUSALS = {400: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class CommentIn(Schema):
    body: str = Field(..., description="the comment's text (markdown; pages render it sanitised)")
    path: str = Field("", description="a file the candidate's patch changes; empty for the whole candidate")
    line: int | None = Field(None, description="a line of that file the diff shows (needs `path`)")
    side: str = Field("", description="the side of the diff `line` is on: \"new\" (the file after the "
                                      "patch; the default) or \"old\" (before it: a deleted or context line)")
    reply_to: int | None = Field(None, description="a thread's id: this comment is a reply in it "
                                                   "(then no `path` or `line`)")


class CommentOut(Schema):
    id: int
    search_id: str
    candidate_id: str
    author: str
    path: str
    line: int | None
    side: Literal["old", "new"] = Field(description="a line thread's side of the diff: old (before the "
                                                    "patch) or new (after it)")
    body: str
    created_at: datetime
    reply_to: int | None = Field(description="the thread it replies in; null for a thread")
    state: Literal["open", "resolved"] | None = Field(description="a thread's state; null for a reply")
    state_changed_by: str = Field(description="who last resolved or reopened the thread")
    state_changed_at: datetime | None
    patch_sha256: str = Field(description="the patch it was made on")
    line_text: str = Field(description="a line thread's line as the diff showed it then")


class ThreadOut(CommentOut):
    outdated: bool = Field(description="a line thread made on an earlier patch whose line the current "
                                       "diff no longer shows, or shows with other text")
    replies: list[CommentOut]


class DecisionIn(Schema):
    patch_sha256: str = Field(..., description="the SHA-256 of the patch you read: the decision is bound "
                                               "to it, and a stale one is a 409")
    note: str = Field("", description="why, for the timeline")


class DecisionOut(Schema):
    id: int
    search_id: str
    candidate_id: str
    decision: Literal["approve", "request_changes"]
    patch_sha256: str
    user: str
    note: str
    created_at: datetime
    mergeable: bool = Field(description="whether the winner has enough standing approvals and no "
                                        "standing request for changes")
    blocker: str = Field(description="why it cannot be merged yet; empty when mergeable")


class MergeIn(Schema):
    target: Literal["new_branch", "existing_branch"] = Field(
        "new_branch", description="a new branch, or an existing branch that still points at the baseline")
    branch: str = Field("", description="the branch's short name; for a new branch, empty means "
                                        "crucible/<search-id>")


class MergeOut(Schema):
    search_id: str
    candidate_id: str
    target: str
    branch: str
    commit_sha: str
    patch_sha256: str
    merged_by: str
    receipt_id: int | None
    created_at: datetime


def _comment_out(candidate: Any, comment: Any) -> dict[str, Any]:
    return {
        "id": comment.pk, "search_id": candidate.search.search_id, "candidate_id": candidate.candidate_id,
        "author": comment.author_name, "path": comment.path, "line": comment.line, "side": comment.side,
        "body": comment.body,
        "created_at": comment.created_at, "reply_to": comment.reply_to_id,
        "state": comment.state if comment.is_thread else None,
        "state_changed_by": comment.state_changed_by_name, "state_changed_at": comment.state_changed_at,
        "patch_sha256": comment.patch_sha256, "line_text": comment.line_text,
    }


@router.get("/searches/{search_id}/candidates/{candidate_id}/comments",
            response={200: list[ThreadOut], 404: ErrorOut})
def candidate_threads(request: HttpRequest, search_id: str, candidate_id: str):
    """The candidate's threads, oldest first, each with its replies and whether it is outdated."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    return [{**_comment_out(candidate, thread["comment"]), "outdated": thread["outdated"],
             "replies": [_comment_out(candidate, reply) for reply in thread["replies"]]}
            for thread in selectors.candidate_threads(candidate)]


@router.post("/searches/{search_id}/candidates/{candidate_id}/comments",
             response={201: CommentOut, **REFUSALS})
def candidate_comment(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str, body: CommentIn):
    """Start a thread on a candidate, on one file its patch changes or on one line its diff shows;
    or, with `reply_to`, reply in a thread. Any project member."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    comment = services.comment_add(request.user, candidate, body.body, body.path, body.line, body.reply_to,
                                   body.side)
    return Status(201, _comment_out(candidate, comment))


@router.post("/searches/{search_id}/candidates/{candidate_id}/comments/{comment_id}/resolve",
             response={200: CommentOut, **REFUSALS})
def candidate_thread_resolve(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str,
                             comment_id: int):
    """Resolve a thread (any project member); resolving a resolved thread changes nothing."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    return _comment_out(candidate, services.thread_resolve(request.user, candidate, comment_id))


@router.post("/searches/{search_id}/candidates/{candidate_id}/comments/{comment_id}/reopen",
             response={200: CommentOut, **REFUSALS})
def candidate_thread_reopen(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str,
                            comment_id: int):
    """Reopen a resolved thread (any project member); reopening an open thread changes nothing."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    return _comment_out(candidate, services.thread_reopen(request.user, candidate, comment_id))


def _decide(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str, decision: str,
            body: DecisionIn) -> dict[str, Any]:
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    approval = services.approval_record(request.user, candidate, decision, body.patch_sha256, body.note)
    state = selectors.approval_state(candidate)
    return {
        "id": approval.pk, "search_id": candidate.search.search_id, "candidate_id": candidate.candidate_id,
        "decision": approval.decision, "patch_sha256": approval.patch_sha256, "user": approval.user_name,
        "note": approval.note, "created_at": approval.created_at,
        "mergeable": state["mergeable"], "blocker": state["blocker"],
    }


@router.post("/searches/{search_id}/candidates/{candidate_id}/approve",
             response={200: DecisionOut, **REFUSALS})
def candidate_approve(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str, body: DecisionIn):
    """Approve a finished search's winner (approver role), bound to the patch hash you read.
    The same decision on the same hash again returns the standing one."""
    return _decide(request, search_id, candidate_id, "approve", body)


@router.post("/searches/{search_id}/candidates/{candidate_id}/request-changes",
             response={200: DecisionOut, **REFUSALS})
def candidate_request_changes(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str,
                              body: DecisionIn):
    """Request changes to a finished search's winner (approver role): it blocks the merge."""
    return _decide(request, search_id, candidate_id, "request_changes", body)


@router.post("/searches/{search_id}/merge", response={201: MergeOut, **REFUSALS})
def search_merge(request: AuthenticatedHttpRequest, search_id: str, body: MergeIn):
    """Commit the approved winner's patch onto the baseline on a new branch (default
    `crucible/<search-id>`) or an existing one still at the baseline. Never pushes."""
    search = selectors.search_for_user(request.user, search_id)
    merge = services.merge_create(request.user, search, body.target, body.branch)
    return Status(201, {"search_id": search.search_id, "candidate_id": merge.candidate.candidate_id,
                        "target": merge.target, "branch": merge.branch, "commit_sha": merge.commit_sha,
                        "patch_sha256": merge.patch_sha256, "merged_by": merge.merged_by_name,
                        "receipt_id": merge.receipt_id, "created_at": merge.created_at})


class RevisionIn(Schema):
    note: str = Field("", description="what you want, for the writer and the timeline (markdown)")


@router.post("/searches/{search_id}/revise", response={202: SearchRunOut, **REFUSALS})
def search_revise(request: AuthenticatedHttpRequest, search_id: str, body: RevisionIn):
    """Send a finished search's winner back to its writer to answer the changes requested
    (operator role): its revised patch is gated, measured beside the baseline and reviewed, then
    waits for approval again; if any of that fails, it keeps the patch it had."""
    search = selectors.search_for_user(request.user, search_id)
    run = services.search_revise(request.user, search, body.note)
    return Status(202, {"search_id": search.search_id, "status": run.status,
                        "detail": f"{run.reason}. Follow it at GET /api/searches/{{id}}/run or on its page."})
