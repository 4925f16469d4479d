"""How search_app's pages show what selectors read: formatting and the context of each card and row.

Views read through selectors and write through services; what a page makes of it (numbers as
people read them, URLs that keep the filters, the record's hashes checked again, the writer's
prompt rebuilt, the chart and the table rows) is built here, once: the run card the search page
renders is the one its live updates (search_app/live.py) send.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db.models import Max
from django.urls import reverse
from django.utils.http import urlencode

from runtime_app import access, tails
from runtime_app.git import GitError, ref_resolve, repo_open
from runtime_app.models import Receipt
from runtime_app.policy import size_text
from runtime_app.presenters import NAME_MAX_LENGTH, short_sha
from runtime_app.prices import usd_text
from runtime_app.selectors import repositories_for_user, repository_refs
from runtime_app.status import Status
from search_app import figures, plotting, selectors
from search_app.diffs import COMPARE_LARGE_FILE_LINES, compare_diff_files
from search_app.execution import search_spec, writer_prompt_parts
from search_app.forms import CommentForm, MergeForm, SearchListForm, SpecEditorForm
from search_app.freeze import candidate_batches, canonical, search_id_for, sha256_hex
from search_app.models import Candidate, Search, SearchRun, Spec, SpecVersion, Step
from search_app.preflight import preflight_report, provider_key_problems
from search_app.spec import spec_validate, spec_warnings
from search_app.spec_templates import SPEC_TEMPLATES
from search_app.status import candidate_status_of, search_status_of, search_statuses
from search_app.templatetags.search_figures import candidate_figures, search_metric

if TYPE_CHECKING:
    from search_app.selectors import SearchListRow, User

GUTTER_MAX_LINES = 10_000  # the editor numbers at most this many lines
# A page carries a patch twice (the no-JavaScript text and diff2html's JSON): past either limit
# it shows the first part and links to the full patch as a download.
PAGE_PATCH_MAX_BYTES = 512 * 1024
PAGE_PATCH_MAX_LINES = 10_000
MODEL_RESOLUTIONS = {
    "preset_pinned": "the provider's model listing was not reachable; the preset's pinned id stands",
    "requested_as_pinned":
        "no listing was consulted and nothing is pinned; the requested id is recorded as is",
    "listing": "resolved through the provider's model listing",
    "preset_default": "the spec named no model; its preset's default model stands",
}


# --- the searches list ------------------------------------------------------------------------

# The list's columns: heading, and the `sort` key that orders by it (descending first, but names).
SEARCH_LIST_COLUMNS = [
    ("Search", "name"), ("Status", None), ("Repository", None), ("Objective", None),
    ("Population · rounds", None), ("Best vs baseline", "best"), ("Spend", "spend"),
    ("Started → finished", "started"), ("Created · author", "created"),
]


def versus(best: float | None, baseline: float | None, direction: str | None, metric: str = "",
           reported: str | None = None, *, ratio: float | None = None, low: float | None = None,
           high: float | None = None) -> dict[str, Any] | None:
    """The best candidate against the baseline, in the metric's unit and words, with the paired
    ratio's interval when there is one: "122× faster (113–126×) · 21.6 ms vs 2.64 s"; `verdict`
    says whether it beats the baseline in the spec's direction."""
    if best is None:
        return None
    shown = figures.metric_of(metric, reported, direction)
    line = figures.versus(best, baseline, shown, ratio=ratio, low=low, high=high)
    assert line is not None  # there is a value
    line["title"] = (f"best candidate {best!r} vs baseline {baseline!r}; {shown.label}"
                     if baseline is not None else f"best {best!r}; the baseline has no score; {shown.label}")
    line["unit"] = shown.unit
    if baseline is None:
        line["verdict"] = ""
    return line


def _best_ratio(search: Any) -> dict[str, float | None]:
    """The best candidate's paired ratio and interval, when the list read one (its figure is not
    its median value): the list then says "122× faster (113–126×)" as the search page does."""
    ratio = getattr(search, "best_ratio", None)
    if ratio is None or ratio == search.best_score:
        return {}
    return {"ratio": ratio, "low": getattr(search, "best_low", None),
            "high": getattr(search, "best_high", None)}


def search_row(search: SearchListRow, status: Status | None = None) -> dict[str, Any]:
    """What one row of the list shows, from a `selectors.search_list_rows` search (no queries) and
    its status (search_app/status.py)."""
    run = getattr(search, "run", None)  # None when not started: select_related cached its absence
    spend = budget = share = ""
    if run is not None:
        spend = usd_text(run.spent_cost_microusd)
        if run.budget_cost_microusd:
            budget = usd_text(run.budget_cost_microusd)
            share = f"{100 * run.spent_cost_microusd / run.budget_cost_microusd:.0f}%"
    return {
        "search": search, "run": run, "status": search.list_status, "outcome": run.outcome if run else "",
        "search_status": status,
        "population": search.population,
        "rounds": " → ".join(str(survivors) for survivors in search.rounds or []),
        "versus": versus(search.best_score, search.baseline_score, search.score_direction,
                         getattr(search, "score_metric", ""), getattr(search, "score_reported", None),
                         **_best_ratio(search)),
        "spend": spend, "budget": budget, "share": share,
    }


def list_url(filters: Mapping[str, Any], **changes: Any) -> str:
    """The list's URL with these filters (defaults left out), so a link or a refresh keeps them."""
    values = {**filters, **changes}
    query = {
        "status": values["status"], "outcome": values["outcome"],
        "project": values["project"].pk if values["project"] is not None else "", "q": values["text"],
        "sort": values["sort"] if values["sort"] != SearchListForm.SORT_DEFAULT else "",
    }
    url = reverse("search_list")
    query = {key: value for key, value in query.items() if value}
    return f"{url}?{urlencode(query)}" if query else url


def list_columns(filters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The headings; a sortable one links to its sort (or the reverse, when it is the current one)."""
    current = filters["sort"].removeprefix("-")
    descending = filters["sort"].startswith("-")
    columns = []
    for label, key in SEARCH_LIST_COLUMNS:
        column: dict[str, Any] = {"label": label, "key": key, "order": "", "url": ""}
        if key is not None:
            if key == current:
                column["order"] = "descending" if descending else "ascending"
                column["url"] = list_url(filters, sort=key if descending else f"-{key}")
            else:
                column["url"] = list_url(filters, sort=key if key == "name" else f"-{key}")
        columns.append(column)
    return columns


def search_list(user: User, filters: Mapping[str, Any]) -> dict[str, Any]:
    """The rows partial's context: the rows (at most SEARCH_LIST_LIMIT), headings and links."""
    limit = selectors.SEARCH_LIST_LIMIT
    found = list(selectors.search_list_rows(user, **filters)[: limit + 1])
    statuses = search_statuses(found[:limit])
    rows = [search_row(search, statuses[search.pk]) for search in found[:limit]]
    return {
        "rows": rows, "more": len(found) > limit, "limit": limit,
        "live": any(row["status"] in selectors.SEARCH_LIST_LIVE for row in rows),
        "list_url": list_url(filters), "columns": list_columns(filters),
        "sort": filters["sort"] if filters["sort"] != SearchListForm.SORT_DEFAULT else "",
        "filtered": bool(filters["status"] or filters["outcome"] or filters["project"] or filters["text"]),
        "can_operate": access.may_operate(user),
    }


# --- the spec editor and its validation -------------------------------------------------------

def _dollars(usd: float | None) -> str:
    return "" if usd is None else usd_text(usd * 1_000_000)


def runnable_context(spec: Any, repository: Any, ref: str) -> dict[str, Any]:
    """What freezing `spec` against `ref` of `repository` would refuse and warn about (its local
    clone as it is now: freezing fetches first)."""
    shown = f"{repository.name} at {ref}"
    try:
        with repo_open(repository.path) as repo:
            commit = ref_resolve(repo, ref)
    except GitError as error:
        return {"where": shown, "problems": [str(error)], "warnings": []}
    problems, warnings = preflight_report(spec, repository.path, commit)
    problems += provider_key_problems(spec.worker.provider)
    return {"where": f"{repository.name} at {ref} ({short_sha(commit)})", "problems": problems,
            "warnings": warnings}


def validation_context(text: str, *, repository: Any = None, ref: str = "") -> dict[str, Any]:
    """What `_validation.html` shows: every error, or the summary card of a valid spec and, when
    a repository and baseline are chosen, what freezing against them would refuse."""
    if not text.strip():
        return {"report": None}
    report = spec_validate(text)
    context: dict[str, Any] = {"report": report}
    if report.valid:
        spec, summary = report.spec, report.summary()
        assert spec is not None and summary is not None  # a valid report has both
        if repository is not None and ref.strip():
            context["runnable"] = runnable_context(spec, repository, ref.strip())
        context.update(
            summary=summary,
            parsed=spec,
            funnel=[
                {"round": number, "survivors": survivors, "effort": effort,
                 "width": max(4, round(100 * survivors / spec.population))}
                # numbered from 0, as the run, its events, receipts and the CLI number rounds
                for number, (survivors, effort) in enumerate(
                    zip(summary["rounds"], summary["efforts"], strict=True))
            ],
            efforts_text=(f"{summary['efforts'][0]} in every round" if len(set(summary["efforts"])) == 1
                          else "per round: " + " → ".join(summary["efforts"])),
            batch_count=len(candidate_batches(spec.population, spec.concurrency)),
            budget_dollars=_dollars(summary["budget_usd"]),
            budget_tokens=f"{summary['budget_tokens']:,}" if summary["budget_tokens"] else "",
        )
    return context


def editor_context(user: User, form: SpecEditorForm, *, text: str, spec: Spec | None,
                   version: SpecVersion | None, repository: Any) -> dict[str, Any]:
    """The editor page: the text with its line numbers, templates, refs of the chosen repository,
    the validation card and, for a saved spec, its versions and searches."""
    context: dict[str, Any] = {
        "form": form,
        "spec": spec,
        "version": version,
        "text": text,
        "line_numbers": range(1, min(text.count("\n") + 1, GUTTER_MAX_LINES) + 1),
        "templates": SPEC_TEMPLATES,
        "template_texts": {template.slug: template.text for template in SPEC_TEMPLATES},
        "repository_choices": form.repositories,
        "draft_projects": form.projects,
        "selected_repository": repository,
        "refs": repository_refs(repository) if repository else None,
        "can_operate": access.may_operate(user),
        **validation_context(text, repository=repository, ref=str(form["ref"].value() or "")),
    }
    if spec is not None:
        context["versions"] = spec.versions.select_related("created_by").order_by("-number")
        context["searches"] = selectors.searches_for_user(user).filter(spec_version__spec=spec)
    return context


def editor_initial(user: User, spec: Spec | None, *, repository_id: int | None, ref: str) -> dict[str, Any]:
    """The editor's initial choices: the repository and ref asked for, else the spec's last
    freeze's, else a project's only repository at its checked-out branch."""
    initial: dict[str, Any] = {"ref": ref}
    if spec is not None:
        initial.update(project=spec.project_id, title=spec.title)
        if repository_id is None:
            last = selectors.searches_for_user(user).filter(spec_version__spec=spec).first()
            if last is not None:
                repository_id = last.repository_id
                initial["ref"] = initial["ref"] or last.ref
        if repository_id is None:  # a project with one repository needs no choosing
            only = list(spec.project.repositories.values_list("pk", flat=True)[:2])
            repository_id = only[0] if len(only) == 1 else None
    if repository_id is not None:
        initial["repository"] = repository_id
        repository = repositories_for_user(user).filter(pk=repository_id).first()
        if repository is not None and not initial["ref"]:
            initial["ref"] = repository_refs(repository)["head"]  # the checked-out branch
    return initial


def title_from(text: str) -> str:
    """A new draft's default title: the spec's `name`, when the TOML has one."""
    try:
        name = tomllib.loads(text).get("name")
    except (ValueError, RecursionError):
        name = None
    return name.strip()[:NAME_MAX_LENGTH] if isinstance(name, str) and name.strip() else "Untitled spec"


def editor_url(spec: Spec, repository: Any, ref: str) -> str:
    """The saved spec's editor, keeping the repository and ref chosen."""
    query = {key: value for key, value in (("repository", repository.pk if repository else ""),
                                           ("ref", ref)) if value}
    url = reverse("spec_edit", args=[spec.pk])
    return f"{url}?{urlencode(query)}" if query else url


# --- a frozen search: its record, run card and candidate table --------------------------------

def search_record(search: Search) -> dict[str, Any]:
    """The frozen record as the search page shows it, with each hash computed again from the
    stored inputs so the page says whether they still match."""
    hashed = search.hashed_inputs or {}
    record_json = hashed.get("record_canonical_json", "")
    evidence, evaluator = hashed.get("evidence") or {}, hashed.get("evaluator") or {}
    recomputed = sha256_hex(record_json.encode())
    return {
        "search": search,
        "record_json": record_json,
        "evidence": evidence,
        "evaluator": evaluator,
        "evidence_json": canonical(evidence).decode(),
        "evaluator_json": canonical(evaluator).decode(),
        "model_resolution": search.model_resolution,
        "model_resolution_note": MODEL_RESOLUTIONS.get(search.model_resolution, ""),
        "checks": {
            "preregistration": recomputed == search.preregistration_hash,
            "search_id": search_id_for(recomputed) == search.search_id,
            "evidence": sha256_hex(canonical(evidence)) == search.public_evidence_hash,
            "evaluator": sha256_hex(canonical(evaluator)) == search.evaluator_hash,
        },
        "batches": search.candidate_batches,
        "candidate_count": sum(len(batch) for batch in search.candidate_batches),
        "empty_message": "No activity for this search yet.",
        "forecast": selectors.search_forecast_before_start(search),
        "results_checked": search_spec(search).score.results_checked,
        "spec_warnings": spec_warnings(search_spec(search)),
    }


CANDIDATE_COLUMNS = [("number", "Candidate"), ("state", "State"), ("round", "Round"), ("gates", "Gates"),
                     ("score", "Score"), ("cost", "Cost"), ("tokens", "Tokens"), ("diff", "Diff lines"),
                     ("", "Why")]


def candidate_table(search: Search, *, sort: str = "number", state: str = "",
                    page: int = 1) -> dict[str, Any]:
    """The candidate table: one page of rows, its headings and state filter, and the query string
    that keeps sort, filter and page (defaults left out)."""
    table = selectors.candidate_rows(search, sort=sort, state=state, page=page)
    query = {k: v for k, v in (("sort", table["sort"]), ("state", table["state"]), ("page", table["page"]))
             if v and v not in ("number", 1)}
    spend_shown = selectors.candidate_spend_shown(search)
    return {"search": search, "table": table, "candidate_states": selectors.CANDIDATE_STATES,
            "table_columns": candidate_columns(spend_shown), "spend_shown": spend_shown,
            "metric": search_metric(search), "table_query": urlencode(query)}


def candidate_columns(spend_shown: bool) -> list[tuple[str, str]]:
    """The table's headings: Cost and Tokens only where a writer can spend (or one did), so a
    search of command writers shows no column that is empty in every row."""
    return [(key, label) for key, label in CANDIDATE_COLUMNS if spend_shown or key not in ("cost", "tokens")]


def score_plot(search: Search, width: int = 640, height: int = 300) -> dict[str, Any]:
    """The score-against-cost chart of the search's scored candidates (plotting.score_plot)."""
    return plotting.score_plot(selectors.score_points(search),
                               (search.spec_normalized or {}).get("score") or {}, search.contract,
                               width, height)


def run_card(search: Search, user: User, *, can_operate: bool, can_approve: bool) -> dict[str, Any]:
    """The run card without its table: summary, funnel, plot and, for a winner, where its approval
    stands and what `user` may not decide. The page and its live updates both render this."""
    summary = selectors.run_summary(search)
    approval = None
    if summary["outcome"] == "winner":
        approval = selectors.approval_state(search.run.winner)
    return {
        "search": search, "report": summary, "search_status": search_status_of(search),
        "funnel": selectors.search_funnel(search),
        "plot": score_plot(search), "approval": approval,
        # the live rows carry the same columns as the table the page rendered
        "spend_shown": selectors.candidate_spend_shown(search),
        "can_operate": can_operate, "can_approve": can_approve,
        "refusals": selectors.decision_refusals(user, search) if approval else None,
    }


def merge_page(user: User, search: Search, form: MergeForm) -> dict[str, Any]:
    """The merge page: the winner with its approval and replay beside the form."""
    summary = selectors.run_summary(search)
    winner = search.run.winner if summary["winner"] else None
    return {
        "search": search, "report": summary, "form": form, "winner": winner,
        "approval": selectors.approval_state(winner) if winner else None,
        "replay": selectors.winner_replay(search) if winner else None,
        "can_approve": access.has_role(user, search.project, access.APPROVER),
    }


# --- a candidate's page -----------------------------------------------------------------------

# Candidates in these states run nothing more; their page stops polling once nothing runs.
LIVE_TAIL_DONE_STATES = (Candidate.State.ELIMINATED, Candidate.State.NOT_ADMITTED, Candidate.State.CANCELLED,
                         Candidate.State.WINNER)
LIVE_TAIL_RECEIPTS = 5  # receipts finished since the page loaded that the box keeps showing


def live_tail(candidate: Candidate, since: int | None = None) -> dict[str, Any]:
    """What the live tail box shows: the commands running now for `candidate` (runtime_app.tails),
    the receipts written after receipt `since` (None: after the newest one now, as a page loads),
    and whether the page should keep polling. Polling marks the candidate watched, which is what
    makes its running commands write their output."""
    receipts = Receipt.objects.filter(subject_type="candidate", subject_id=candidate.pk)
    if since is None:  # read before the tails: a command ending in between shows as finished
        since = receipts.aggregate(newest=Max("pk"))["newest"] or 0
    subject = ("candidate", candidate.pk)
    running = tails.tails_running(subject)
    finished = list(receipts.filter(pk__gt=since).order_by("-pk")[:LIVE_TAIL_RECEIPTS])[::-1]
    status = SearchRun.objects.filter(search_id=candidate.search_id).values_list("status", flat=True).first()
    active = bool(running) or (status in (SearchRun.Status.RUNNING, SearchRun.Status.CANCELLING)
                               and candidate.state not in LIVE_TAIL_DONE_STATES)
    if active:
        tails.tails_watch(subject)
    else:
        tails.tails_unwatch(subject)
    return {"running": running, "finished": finished, "since": since, "active": active}


def _writer_prompts(candidate: Candidate, steps: list[dict[str, Any]]) -> tuple[dict[str, str] | None,
                                                                                 list[dict[str, Any]]]:
    """The prompt the writer was given, rebuilt from the frozen search, and each refinement's."""
    if not candidate.number:
        return None, []
    search = candidate.search
    spec = search_spec(search)
    prefix, suffix = writer_prompt_parts(search, spec, candidate.candidate_id, 0)
    refinements = []
    for row in steps:
        step = row["step"]
        if step is not None and step.refines and step.state == Step.State.DONE:
            result = step.result or {}
            refinements.append({
                "round": step.round, "revision": step.plan.get("revision"),
                "transcript": result.get("transcript", []),
                "suffix": writer_prompt_parts(search, spec, candidate.candidate_id, step.round,
                                              result.get("refining", ""))[1],
                "outcome": result.get("eliminated") or f"patch {short_sha(result.get('patch_sha256', ''))}",
            })
    return {"prefix": prefix, "suffix": suffix}, refinements


def candidate_page(user: User, candidate: Candidate, **extra: Any) -> dict[str, Any]:
    """Everything the candidate's page shows: its steps and receipts, the patch (cut to what a
    page carries), the writer's prompt and transcript, threads and timeline, and for the winner
    its approval, replay and what `user` may not do. `extra` adds or replaces entries (a form
    with its errors)."""
    search = candidate.search
    steps = selectors.candidate_steps(candidate)
    generate = next((row["step"] for row in steps
                     if row["step"] is not None and row["step"].kind == Step.Kind.GENERATE), None)
    calls = [r for row in steps for r in row["receipts"] if r.kind == "llm_call"]
    admit = next((r for row in steps for r in row["receipts"] if r.kind == "apply"), None)
    prompt, refinements = _writer_prompts(candidate, steps)
    summary = selectors.run_summary(search)
    is_winner = summary["winner"] == candidate.candidate_id
    threads = selectors.candidate_threads(candidate)
    return {
        "search": search, "candidate": candidate, "steps": steps, "calls": calls, "admit": admit,
        "files": selectors.candidate_file_stats(candidate), "patch": patch_shown(bytes(candidate.patch)),
        "prompt": prompt, "refinements": refinements,
        "transcript": (generate.result or {}).get("transcript", []) if generate else [],
        "writer_stop": (generate.result or {}).get("stop", "") if generate else "",
        "threads": threads, "thread_ids": [thread["comment"].pk for thread in threads],
        "timeline": selectors.candidate_timeline(candidate, threads),
        "anchors": selectors.diff_anchors(candidate), "reviews": candidate.reviews.order_by("-id"),
        "report": summary, "is_winner": is_winner, "score_line": candidate_score_line(candidate),
        "candidate_status": candidate_status_of(candidate),
        "approval": selectors.approval_state(candidate) if is_winner else None,
        "replay": selectors.winner_replay(search) if is_winner else None,
        "can_approve": access.has_role(user, search.project, access.APPROVER),
        "refusals": selectors.decision_refusals(user, search) if is_winner else None,
        "revision_refusal": selectors.revision_refusal(user, search) if is_winner else "",
        "revising": is_winner and summary.get("phase") == "revise",
        "comment_form": extra.pop("comment_form", None) or CommentForm(),
        "live": live_tail(candidate),
        **extra,
    }


def candidate_score_line(candidate: Candidate) -> dict[str, Any] | None:
    """"122× faster (113–126×) · 21.6 ms vs 2.64 s": the candidate against the baseline's median,
    in the metric's unit and words (for the baseline, its own value)."""
    search = candidate.search
    value = candidate.score_absolute if candidate.score_absolute is not None else candidate.score
    if value is None:
        return None
    baseline = base = None
    if candidate.number:
        base = Candidate.objects.filter(search=search, number=0).values_list(
            "score_absolute", "score", "spread").first()
        if base is not None:
            baseline = base[0] if base[0] is not None else base[1]
    paired = figures.paired_figure(candidate)
    return figures.versus(value, baseline, search_metric(search), ratio=candidate.score if paired else None,
                          low=candidate.score_low if paired else None,
                          high=candidate.score_high if paired else None, spread=candidate.spread,
                          baseline_spread=base[2] if base is not None else None)


def patch_shown(text: bytes, max_bytes: int | None = None, max_lines: int | None = None) -> dict[str, Any]:
    """The part of a patch a page shows: all of it, or at most `max_bytes` and `max_lines`
    (PAGE_PATCH_MAX_BYTES, PAGE_PATCH_MAX_LINES), cut after the last whole file that fits, or
    after a line when even the first file does not; with what was left out, for the note."""
    max_bytes = PAGE_PATCH_MAX_BYTES if max_bytes is None else max_bytes
    max_lines = PAGE_PATCH_MAX_LINES if max_lines is None else max_lines
    lines = text.count(b"\n") + (1 if text and not text.endswith(b"\n") else 0)
    files = text.count(b"\ndiff --git ") + text.startswith(b"diff --git ")
    part = text
    if len(text) > max_bytes or lines > max_lines:
        part = text[:max_bytes]
        end = 0
        for _ in range(max_lines):
            found = part.find(b"\n", end)
            if found < 0:
                break
            end = found + 1
        part = part[:end] or part
        boundary = part.rfind(b"\ndiff --git ")
        part = part[: boundary + 1] if boundary > 0 else part
    shown_lines = part.count(b"\n") + (1 if part and not part.endswith(b"\n") else 0)
    shown_files = part.count(b"\ndiff --git ") + part.startswith(b"diff --git ")
    in_files = f", {shown_files:,} of {files:,} files" if files > 1 else ""
    return {
        "text": part.decode("utf-8", errors="replace"), "truncated": part is not text,
        "bytes": len(text), "lines": lines, "files": files,
        "shown_bytes": len(part), "shown_lines": shown_lines, "shown_files": shown_files,
        "note": f"Only the first {shown_lines:,} of its {lines:,} lines ({size_text(len(part))} of "
                f"{size_text(len(text))}{in_files}) are shown here; {lines - shown_lines:,} lines "
                f"({size_text(len(text) - len(part))}) are left out.",
    }


# --- comparing candidates ---------------------------------------------------------------------

def _number_text(value: float | None) -> str:
    if value is None:
        return "—"
    if value != value or abs(value) == float("inf"):
        return str(value)
    return f"{int(value):,}" if value == int(value) and abs(value) < 1e15 else f"{value:.6g}"


def _exact(value: float | None) -> str:
    return "" if value is None else repr(value)


def _round_key(key: Any) -> tuple[int, str]:
    text = str(key)
    return (int(text), text) if text.isdigit() else (1 << 30, text)


# Rows left out when no candidate has a value in them.
COMPARE_OPTIONAL_ROWS = ("Median value", "Spread (max − min)", "Runtime (mean trial)", "Cost", "Tokens")
COMPARE_SPEND_ROWS = ("Cost", "Tokens")  # nothing spent is empty; a zero spread is a figure


def compare_rows(search: Search, candidates: list[Any], *, paired: bool = False) -> list[dict[str, Any]]:
    """The metric rows of the compare table (no queries): per row its label, one cell per
    candidate ({"text", "title"}) and `same`, true when every candidate has the same value.
    `paired`: scores are ratios to the baseline, shown with their intervals."""
    spec = search.spec_normalized or {}
    rounds = list(spec.get("rounds") or [])
    gates = len((spec.get("hard_gates") or {}).get("commands") or [])

    def cell(value: Any, text: str, title: str = "") -> dict[str, Any]:
        return {"value": value, "text": text, "title": title}

    def reached(c: Any) -> dict[str, Any]:
        if c.round_reached < 0:
            return cell(c.round_reached, "—", "not evaluated in any round")
        last = " (last)" if rounds and c.round_reached == len(rounds) - 1 else ""
        admits = f", which admits {rounds[c.round_reached]}" if c.round_reached < len(rounds) else ""
        return cell(c.round_reached, f"{c.round_reached}{last}",
                    f"round {c.round_reached} of rounds {rounds}{admits}" if rounds else "")

    metric = search_metric(search)

    def trials(c: Any, key: str) -> dict[str, Any]:
        values = (c.trials or {}).get(key)
        if not values:
            return cell(None, "—")
        return cell(list(values), figures.trials_text(values, metric), ", ".join(repr(v) for v in values))

    def score(c: Any) -> dict[str, Any]:
        if c.score is None:
            return cell(None, "—")
        shown = candidate_figures(c, search)
        if figures.paired_figure(c) and c.number:  # as the candidate table reads it
            return cell(c.score, shown["score"], f"median ratio to the baseline in the same blocks "
                        f"{c.score!r} [{c.score_low!r}, {c.score_high!r}], in {metric.label}")
        return cell(c.score, shown["value"], _exact(c.score))

    def files(c: Any) -> dict[str, Any]:
        paths = list(c.files or [])
        return cell(paths, str(len(paths)), "\n".join(paths))

    def sha(c: Any) -> dict[str, Any]:
        return cell(c.patch_sha256, short_sha(c.patch_sha256) if c.patch_sha256 else "—", c.patch_sha256)

    specs: list[tuple[str, Any]] = [
        ("State", lambda c: cell(c.state, c.get_state_display())),
        ("Round reached", reached),
        ("Gates passed", lambda c: cell(c.gates_passed, f"{c.gates_passed} of {gates}" if gates
                                        else str(c.gates_passed))),
        ("Score", score),
        ("Median value", lambda c: cell(c.score_absolute, figures.quantity(
            c.score_absolute, metric, c.spread), _exact(c.score_absolute))),
        ("Spread (max − min)", lambda c: cell(c.spread, figures.spread_text(
            c.spread, metric, c.score_absolute).removeprefix("spread ") or "—", _exact(c.spread))),
    ]
    keys = sorted({str(k) for c in candidates for k in (c.trials or {})}, key=_round_key)
    specs += [(f"Trials, round {key}", lambda c, key=key: trials(c, key)) for key in keys]
    specs += [
        ("Runtime (mean trial)", lambda c: cell(c.runtime_seconds, figures.quantity(
            c.runtime_seconds, figures.metric_of("runtime:wall_seconds")))),
        ("Cost", lambda c: cell(c.cost_microusd, usd_text(c.cost_microusd), f"{c.cost_microusd:,} µUSD")),
        ("Tokens", lambda c: cell(c.tokens, f"{c.tokens:,}")),
        ("Diff lines", lambda c: cell(c.diff_lines, _number_text(c.diff_lines))),
        ("Files changed", files),
        ("Patch SHA-256", sha),
        ("Reason", lambda c: cell(c.reason, c.reason or "—")),
    ]
    rows = []
    for label, make in specs:
        cells = [make(c) for c in candidates]
        empty = (lambda v: not v) if label in COMPARE_SPEND_ROWS else (lambda v: v is None)
        if label in COMPARE_OPTIONAL_ROWS and all(empty(item["value"]) for item in cells):
            continue  # empty for every candidate (no cost for command writers): not worth a row
        rows.append({"label": label, "cells": cells,
                     "same": all(item["value"] == cells[0]["value"] for item in cells)})
    return rows



def compare_page(search: Search, path: str, requested: list[str], differences_only: bool) -> dict[str, Any]:
    """The compare page: the picker, the problems with the pick, and for a good pick the metric
    rows (`differences_only`: those that differ) and the diff from the first pick's patched tree
    to the second's, cut to what a page carries. `path` is the page's own, for the toggle link."""
    search_id = search.search_id
    choices = selectors.compare_choices(search)
    picked_ids: list[str] = []
    problems: list[str] = []
    if requested:
        picked_ids, problems = selectors.compare_pick(requested, [c.candidate_id for c in choices])
    candidates = selectors.compare_candidates(search, picked_ids) if picked_ids else []
    query = [("c", candidate_id) for candidate_id in picked_ids]
    context: dict[str, Any] = {
        "search": search, "choices": choices, "problems": problems, "checked": set(requested),
        "metric": search_metric(search),
        "differences_only": differences_only, "candidates": [], "rows": [], "diff": None,
        "min_picked": selectors.COMPARE_MIN, "max_picked": selectors.COMPARE_MAX,
        "large_lines": COMPARE_LARGE_FILE_LINES,
        "toggle_url": f"{path}?{urlencode(query + ([] if differences_only else [('diff', '1')]))}",
    }
    if candidates:
        rows = compare_rows(search, candidates, paired=selectors.search_paired(search))
        diff = selectors.compare_tree_diff(search, candidates[0], candidates[1])
        shown = patch_shown(diff["text"].encode())
        context.update(
            candidates=[{"candidate": c, "url": reverse("candidate_detail", args=[search_id, c.candidate_id])}
                        for c in candidates],
            rows=[row for row in rows if not (differences_only and row["same"])],
            hidden_rows=sum(1 for row in rows if row["same"]) if differences_only else 0,
            diff=diff, diff_shown=shown, diff_truncated=diff["truncated"] or shown["truncated"],
            diff_files=compare_diff_files(shown["text"]),
            diff_limit_mb=selectors.COMPARE_DIFF_MAX_BYTES / 1_000_000,
            diff_download_url=f"{reverse('search_compare_diff', args=[search_id])}?{urlencode(query)}",
        )
    return context
