"""Pages of search_app: the searches list, the spec editor, spec diffs and frozen searches.

Thin views: reads go through selectors (404 for outsiders), writes through services
(PermissionDenied → 403, ValidationError → the page again with the problems, status 400).
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from runtime_app import access
from runtime_app.policy import size_text
from runtime_app.prices import usd_text
from runtime_app.selectors import repositories_for_user, repository_for_user, repository_refs
from runtime_app.views import _apply_errors, _live_context
from search_app import selectors, services
from search_app.execution import search_spec
from search_app.forms import (
    CommentForm,
    DecisionForm,
    MergeForm,
    RevisionForm,
    SpecDiffForm,
    SpecEditorForm,
    normalize_newlines,
)
from search_app.freeze import candidate_batches, canonical, search_id_for, sha256_hex
from search_app.git_http import git_respond
from search_app.models import Spec
from search_app.preflight import provider_problems
from search_app.selection import is_better
from search_app.spec import spec_validate
from search_app.spec_templates import SPEC_TEMPLATES, spec_template_get
from search_app.templatetags.search_figures import change_text

GUTTER_MAX_LINES = 10_000  # the editor numbers at most this many lines
# A page carries a patch twice (the no-JavaScript text and diff2html's JSON): past either limit
# it shows the first part and links to the full patch as a download.
PAGE_PATCH_MAX_BYTES = 512 * 1024
PAGE_PATCH_MAX_LINES = 10_000
DOWNLOAD_CHUNK_BYTES = 64 * 1024
_FILE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
MODEL_RESOLUTIONS = {
    "preset_pinned": "the provider's model listing was not reachable; the preset's pinned id stands",
    "requested_as_pinned":
        "no listing was consulted and nothing is pinned; the requested id is recorded as is",
    "listing": "resolved through the provider's model listing",
    "preset_default": "the spec named no model; its preset's default model stands",
}


def _id(value: Any) -> int | None:
    """A database id from a query or form value, or None for anything else."""
    text = str(value if value is not None else "")
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


# --- the searches list ------------------------------------------------------------------------

# The list's columns: heading, and the `sort` key that orders by it (descending first, but names).
SEARCH_LIST_COLUMNS = [
    ("Search", "name"), ("Status", None), ("Repository", None), ("Objective", None),
    ("Population · rounds", None), ("Best vs baseline", "best"), ("Spend", "spend"),
    ("Started → finished", "started"), ("Created · author", "created"),
]


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")  # not NaN, not ±inf


def _score_text(value: float) -> str:
    """A score as people read it: 712, 0.45, 1,234.5, 0.000123."""
    if not _finite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def _versus(best: float | None, baseline: float | None, direction: str | None,
            metric: str = "") -> dict[str, str] | None:
    """"0.45 vs 712 (1,582x faster)", "11 vs 10 (+10.0%)", and whether the best beats the
    baseline in the spec's direction."""
    if best is None:
        return None
    direction = direction or "minimize"  # the spec's default
    if baseline is None:
        return {"text": _score_text(best), "verdict": "", "title": f"best {best!r} ({direction}); "
                                                                   "the baseline has no score"}
    text, verdict = f"{_score_text(best)} vs {_score_text(baseline)}", "same"
    if best != baseline:
        verdict = "better" if is_better(best, baseline, direction) else "worse"
    change = change_text(best, baseline, metric)
    if change:
        text += f" ({change})"
    return {"text": text, "verdict": verdict,
            "title": f"best candidate {best!r} vs baseline {baseline!r}; {direction}, so this is {verdict}"}


def _search_row(search: Any) -> dict[str, Any]:
    """What one row of the list shows, from a `selectors.search_list_rows` search (no queries)."""
    run = getattr(search, "run", None)  # None when not started: select_related cached its absence
    spend = budget = share = ""
    if run is not None:
        spend = usd_text(run.spent_cost_microusd)
        if run.budget_cost_microusd:
            budget = usd_text(run.budget_cost_microusd)
            share = f"{100 * run.spent_cost_microusd / run.budget_cost_microusd:.0f}%"
    return {
        "search": search, "run": run, "status": search.list_status, "outcome": run.outcome if run else "",
        "population": search.population,
        "rounds": " → ".join(str(survivors) for survivors in search.rounds or []),
        "versus": _versus(search.best_score, search.baseline_score, search.score_direction,
                          getattr(search, "score_metric", "")),
        "spend": spend, "budget": budget, "share": share,
    }


def _list_url(filters: dict[str, Any], **changes: Any) -> str:
    """The list's URL with these filters (defaults left out), so a link or a refresh keeps them."""
    from search_app.forms import SearchListForm

    values = {**filters, **changes}
    query = {
        "status": values["status"], "outcome": values["outcome"],
        "project": values["project"].pk if values["project"] is not None else "", "q": values["text"],
        "sort": values["sort"] if values["sort"] != SearchListForm.SORT_DEFAULT else "",
    }
    url = reverse("search_list")
    query = {key: value for key, value in query.items() if value}
    return f"{url}?{urlencode(query)}" if query else url


def _list_columns(filters: dict[str, Any]) -> list[dict[str, Any]]:
    """The headings; a sortable one links to its sort (or the reverse, when it is the current one)."""
    current = filters["sort"].removeprefix("-")
    descending = filters["sort"].startswith("-")
    columns = []
    for label, key in SEARCH_LIST_COLUMNS:
        column: dict[str, Any] = {"label": label, "key": key, "order": "", "url": ""}
        if key is not None:
            if key == current:
                column["order"] = "descending" if descending else "ascending"
                column["url"] = _list_url(filters, sort=key if descending else f"-{key}")
            else:
                column["url"] = _list_url(filters, sort=key if key == "name" else f"-{key}")
        columns.append(column)
    return columns


@require_GET
def search_list(request: HttpRequest) -> HttpResponse:
    """The searches the user can see as a run table, filtered and sorted by the query string.

    An htmx request (the filter form, a heading, the refresh while something runs) gets only
    the rows partial; the full page includes the same partial.
    """
    from django.utils.cache import patch_vary_headers

    from search_app.forms import SearchListForm

    filters = SearchListForm(request.user, request.GET).filters()
    limit = selectors.SEARCH_LIST_LIMIT
    found = list(selectors.search_list_rows(request.user, **filters)[: limit + 1])
    rows = [_search_row(search) for search in found[:limit]]
    context: dict[str, Any] = {
        "rows": rows, "more": len(found) > limit, "limit": limit,
        "live": any(row["status"] in selectors.SEARCH_LIST_LIVE for row in rows),
        "list_url": _list_url(filters), "columns": _list_columns(filters),
        "sort": filters["sort"] if filters["sort"] != SearchListForm.SORT_DEFAULT else "",
        "filtered": bool(filters["status"] or filters["outcome"] or filters["project"] or filters["text"]),
        "can_operate": access.may_operate(request.user),
    }
    htmx = request.htmx
    if htmx and not htmx.boosted and not htmx.history_restore_request:
        response = render(request, "search_app/_search_rows.html", context)
        if htmx.trigger == "search-filters":  # the address bar gets the tidy URL, not `?q=&status=…`
            response["HX-Push-Url"] = context["list_url"]
    else:
        context.update(
            form=SearchListForm(request.user, initial={
                "status": filters["status"], "outcome": filters["outcome"], "project": filters["project"],
                "q": filters["text"],
            }),
            specs=selectors.spec_list_for_user(request.user)[:200],
        )
        response = render(request, "search_app/search_list.html", context)
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- the validation partial -------------------------------------------------------------------

def _dollars(usd: float | None) -> str:
    return "" if usd is None else usd_text(usd * 1_000_000)


def validation_context(text: str) -> dict[str, Any]:
    """What `_validation.html` shows: every error, or the summary card of a valid spec."""
    if not text.strip():
        return {"report": None}
    report = spec_validate(text)
    context: dict[str, Any] = {"report": report}
    if report.valid:
        spec, summary = report.spec, report.summary()
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


@require_POST
def spec_validate_partial(request: HttpRequest) -> HttpResponse:
    """HTMX: validate the editor's text as the user types. Reading only: any member may."""
    text = normalize_newlines(request.POST.get("text", ""))
    return render(request, "search_app/_validation.html", validation_context(text))


@require_GET
def spec_refs(request: HttpRequest) -> HttpResponse:
    """HTMX: the branches and tags of the chosen repository, as the ref input's datalist."""
    raw = request.GET.get("repository", "")
    repository = None
    if raw:
        repository_id = _id(raw)
        if repository_id is None:
            raise Http404("No such repository.")
        repository = repository_for_user(request.user, repository_id)
    return render(request, "search_app/_refs.html", {
        "repository": repository, "refs": repository_refs(repository) if repository else None,
    })


# --- the editor -------------------------------------------------------------------------------

def _selected_repository(form: SpecEditorForm) -> Any:
    repository_id = _id(form["repository"].value())
    if repository_id is None:
        return None
    return form.fields["repository"].queryset.filter(pk=repository_id).first()


def _editor(
    request: HttpRequest, form: SpecEditorForm, *, text: str, spec: Spec | None = None,
    version: Any = None, status: int = 200,
) -> HttpResponse:
    repository = _selected_repository(form)
    context: dict[str, Any] = {
        "form": form,
        "spec": spec,
        "version": version,
        "text": text,
        "line_numbers": range(1, min(text.count("\n") + 1, GUTTER_MAX_LINES) + 1),
        "templates": SPEC_TEMPLATES,
        "template_texts": {template.slug: template.text for template in SPEC_TEMPLATES},
        "repository_choices": form.fields["repository"].queryset,
        "draft_projects": form.fields["project"].queryset,
        "selected_repository": repository,
        "refs": repository_refs(repository) if repository else None,
        "can_operate": access.may_operate(request.user),
        **validation_context(text),
    }
    if spec is not None:
        context["versions"] = spec.versions.select_related("created_by").order_by("-number")
        context["searches"] = selectors.searches_for_user(request.user).filter(spec_version__spec=spec)
    return render(request, "search_app/spec_editor.html", context, status=status)


def _initial(request: HttpRequest, spec: Spec | None) -> dict[str, Any]:
    """Initial choices from the query (`?repository=3&ref=main`) or the spec's last freeze."""
    initial: dict[str, Any] = {"ref": request.GET.get("ref", "")[:255]}
    repository_id = _id(request.GET.get("repository"))
    if spec is not None:
        initial.update(project=spec.project_id, title=spec.title)
        if repository_id is None:
            last = selectors.searches_for_user(request.user).filter(spec_version__spec=spec).first()
            if last is not None:
                repository_id = last.repository_id
                initial["ref"] = initial["ref"] or last.ref
        if repository_id is None:  # a project with one repository needs no choosing
            only = list(spec.project.repositories.values_list("pk", flat=True)[:2])
            repository_id = only[0] if len(only) == 1 else None
    if repository_id is not None:
        initial["repository"] = repository_id
        repository = repositories_for_user(request.user).filter(pk=repository_id).first()
        if repository is not None and not initial["ref"]:
            initial["ref"] = repository_refs(repository)["head"]  # the checked-out branch
    return initial


def _title_from(text: str) -> str:
    """A new draft's default title: the spec's `name`, when the TOML has one."""
    try:
        name = tomllib.loads(text).get("name")
    except (ValueError, RecursionError):
        name = None
    return name.strip()[:96] if isinstance(name, str) and name.strip() else "Untitled spec"


def _editor_url(spec: Spec, repository: Any, ref: str) -> str:
    query = {key: value for key, value in (("repository", repository.pk if repository else ""),
                                           ("ref", ref)) if value}
    url = reverse("spec_edit", args=[spec.pk])
    return f"{url}?{urlencode(query)}" if query else url


def _editor_post(request: HttpRequest, spec: Spec | None) -> HttpResponse:
    """Save a draft (`action=save`) or freeze (`action=freeze`); on a problem, the same page
    again with everything the user typed and the problems, status 400."""
    form = SpecEditorForm(request.user, request.POST, spec=spec)
    text = normalize_newlines(request.POST.get("text", ""))
    freezing = request.POST.get("action") == "freeze"
    if not form.is_valid():
        return _editor(request, form, text=text, spec=spec, status=400)
    data = form.cleaned_data
    project, repository, ref, text = data["project"], data["repository"], data["ref"].strip(), data["text"]
    title = data["title"] or _title_from(text)
    previous = spec.latest if spec is not None else None
    try:
        if freezing:
            search = services.spec_draft_freeze(
                request.user, project, spec, title, text, ref, repository
            )
        else:
            saved, version = services.spec_draft_save(request.user, project, spec, title, text)
    except ValidationError as error:
        _apply_errors(form, error)
        return _editor(request, form, text=text, spec=spec, status=400)
    if freezing:
        messages.success(request, f"Frozen as {search.search_id}.")
        # Freezing spends nothing; Start asks again before anything is (search_start).
        for warning in provider_problems(search_spec(search).worker.provider):
            messages.warning(request, f"Before you start it: {warning}")
        return redirect("search_detail", search_id=search.search_id)
    if spec is None:
        messages.success(request, f"Draft {saved.title} saved as v{version.number}.")
    elif previous is not None and previous.pk == version.pk:
        messages.info(request, f"No changes since v{version.number}; nothing new saved.")
    else:
        messages.success(request, f"Saved as v{version.number}.")
    return redirect(_editor_url(saved, repository, ref))


@require_http_methods(["GET", "POST"])
def spec_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _editor_post(request, spec=None)
    template = spec_template_get(request.GET.get("template"))
    form = SpecEditorForm(request.user, initial=_initial(request, None))
    projects = form.fields["project"].queryset
    if "repository" in form.initial:
        chosen = form.fields["repository"].queryset.filter(pk=form.initial["repository"]).first()
        if chosen is not None:
            form.initial["project"] = chosen.project_id
    if "project" not in form.initial and len(projects) == 1:
        form.initial["project"] = projects[0].pk
    return _editor(request, form, text=template.text if template else "")


@require_http_methods(["GET", "POST"])
def spec_edit(request: HttpRequest, spec_id: int) -> HttpResponse:
    spec = selectors.spec_for_user(request.user, spec_id)
    if request.method == "POST":
        return _editor_post(request, spec=spec)
    version = spec.latest
    if "version" in request.GET:
        number = _id(request.GET["version"])
        if number is None:
            raise Http404("No such version.")
        version = selectors.spec_version_get(spec, number)
    template = spec_template_get(request.GET.get("template"))
    text = template.text if template else (version.text if version else "")
    form = SpecEditorForm(request.user, spec=spec, initial=_initial(request, spec))
    return _editor(request, form, text=text, spec=spec, version=version)


@require_POST
def spec_duplicate(request: HttpRequest, spec_id: int) -> HttpResponse:
    spec = selectors.spec_for_user(request.user, spec_id)
    copy = services.spec_duplicate(request.user, spec)
    messages.success(request, f"Duplicated {spec.title} as {copy.title}.")
    return redirect("spec_edit", spec_id=copy.pk)


def _diff_rows(diff: str) -> list[tuple[str, str]]:
    rows = []
    for index, line in enumerate(diff.split("\n")[:-1] if diff else []):
        if index < 2:
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        elif line.startswith("\\"):
            kind = "note"
        else:
            kind = "context"
        rows.append((kind, line))
    return rows


@require_GET
def spec_diff(request: HttpRequest, spec_id: int) -> HttpResponse:
    spec = selectors.spec_for_user(request.user, spec_id)
    numbers = list(spec.versions.order_by("number").values_list("number", flat=True))
    context: dict[str, Any] = {"spec": spec, "numbers": numbers, "rows": None}
    if not numbers:
        return render(request, "search_app/spec_diff.html", context)
    query = request.GET if ("from" in request.GET or "to" in request.GET) else {
        "from": numbers[-2] if len(numbers) > 1 else numbers[-1], "to": numbers[-1],
    }
    form = SpecDiffForm(query)
    context["form"] = form
    if not form.is_valid():
        return render(request, "search_app/spec_diff.html", context, status=400)
    old = selectors.spec_version_get(spec, form.cleaned_data["from"])
    new = selectors.spec_version_get(spec, form.cleaned_data["to"])
    context.update(old=old, new=new, rows=_diff_rows(selectors.spec_diff(old, new)))
    return render(request, "search_app/spec_diff.html", context)


# --- frozen searches --------------------------------------------------------------------------

@require_GET
def search_detail(request: HttpRequest, search_id: str) -> HttpResponse:
    search = selectors.search_for_user(request.user, search_id)
    hashed = search.hashed_inputs or {}
    record_json = hashed.get("record_canonical_json", "")
    evidence, evaluator = hashed.get("evidence") or {}, hashed.get("evaluator") or {}
    recomputed = sha256_hex(record_json.encode())
    return render(request, "search_app/search_detail.html", {
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
        **_run_context(request, search),
        **_live_context(request, subject=("search", search.pk)),
    })


@require_GET
def search_record(request: HttpRequest, search_id: str) -> HttpResponse:
    """The exact canonical JSON bytes: `sha256sum` of this file is the preregistration hash."""
    search = selectors.search_for_user(request.user, search_id)
    response = HttpResponse(
        (search.hashed_inputs or {}).get("record_canonical_json", "").encode(),
        content_type="application/json; charset=utf-8",
    )
    response["Content-Disposition"] = f'attachment; filename="{search.search_id}.json"'
    return response


CANDIDATE_COLUMNS = [("number", "Candidate"), ("state", "State"), ("round", "Round"), ("gates", "Gates"),
                     ("score", "Score"), ("cost", "Cost"), ("tokens", "Tokens"), ("diff", "Diff lines"),
                     ("", "Why")]


def _page_number(value: Any) -> int:
    number = _id(value)
    return number if number and number < 100_000 else 1


def _table_context(request: HttpRequest, search) -> dict[str, Any]:
    table = selectors.candidate_rows(search, sort=str(request.GET.get("sort", "number"))[:20],
                                     state=str(request.GET.get("state", ""))[:20],
                                     page=_page_number(request.GET.get("page")))
    query = {k: v for k, v in (("sort", table["sort"]), ("state", table["state"]), ("page", table["page"]))
             if v and v not in ("number", 1)}
    return {"search": search, "table": table, "candidate_states": selectors.CANDIDATE_STATES,
            "table_columns": CANDIDATE_COLUMNS, "table_query": urlencode(query)}


def _run_context(request: HttpRequest, search) -> dict[str, Any]:
    summary = selectors.run_summary(search)
    approval = None
    if summary["outcome"] == "winner":
        approval = selectors.approval_state(search.run.winner)
    return {
        "search": search, "report": summary, "funnel": selectors.search_funnel(search),
        "plot": selectors.score_plot(search), "approval": approval,
        "can_operate": access.may_operate(request.user, search.project),
        "can_approve": access.has_role(request.user, search.project, access.APPROVER),
        "refusals": selectors.decision_refusals(request.user, search) if approval else None,
        **_table_context(request, search),
    }


@require_GET
def search_run_partial(request: HttpRequest, search_id: str) -> HttpResponse:
    """The run card alone (summary, funnel, plot and the candidate table)."""
    search = selectors.search_for_user(request.user, search_id)
    return render(request, "search_app/_run.html", _run_context(request, search))


@require_GET
def search_candidates(request: HttpRequest, search_id: str) -> HttpResponse:
    """The candidate table, sorted, filtered and paged from the query string (htmx or not)."""
    search = selectors.search_for_user(request.user, search_id)
    if request.htmx and not request.htmx.history_restore_request:
        context = _table_context(request, search)
        response = render(request, "search_app/_candidates.html", context)
        url = reverse("search_detail", args=[search.search_id])
        response["HX-Push-Url"] = f"{url}?{context['table_query']}" if context["table_query"] else url
        return response
    url = reverse("search_detail", args=[search.search_id])
    query = request.GET.urlencode()
    return redirect(f"{url}?{query}#candidates" if query else url)


@require_POST
def search_start(request: HttpRequest, search_id: str) -> HttpResponse:
    """Start the search; a provider with no key or no server asks the person first."""
    search = selectors.search_for_user(request.user, search_id)
    try:
        services.search_start_checked(request.user, search,
                                      start_anyway=request.POST.get("start_anyway") == "1")
    except services.ProviderUnready as unready:
        return render(request, "search_app/search_start_confirm.html",
                      {"search": search, "provider_warnings": unready.messages}, status=409)
    except ValidationError as error:  # a command that cannot start: refused before anything runs
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"{search.search_id} started: workers are taking its steps.")
    return redirect("search_detail", search_id=search.search_id)


@require_http_methods(["GET", "POST"])
def search_cancel(request: HttpRequest, search_id: str) -> HttpResponse:
    """The confirmation (what stops, what is kept), then the cancel itself."""
    search = selectors.search_for_user(request.user, search_id)
    if request.method == "GET":
        return render(request, "search_app/search_cancel.html", {
            "search": search, "report": selectors.run_summary(search),
            "running": search.steps.filter(state="running").count(),
            "can_operate": access.may_operate(request.user, search.project)})
    try:
        services.search_cancel(request.user, search)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"{search.search_id}: cancelling; running steps are being stopped.")
    return redirect("search_detail", search_id=search.search_id)


# --- candidates, review, approval and merge ---------------------------------------------------

def _candidate_context(request: HttpRequest, candidate, **extra: Any) -> dict[str, Any]:
    from search_app.execution import search_spec, writer_prompt_parts

    search = candidate.search
    steps = selectors.candidate_steps(candidate)
    generate = next((row["step"] for row in steps
                     if row["step"] is not None and row["step"].kind == "generate"), None)
    calls = [r for row in steps for r in row["receipts"] if r.kind == "llm_call"]
    admit = next((r for row in steps for r in row["receipts"] if r.kind == "apply"), None)
    prompt, refinements = None, []
    if candidate.number:
        spec = search_spec(search)
        prefix, suffix = writer_prompt_parts(search, spec, candidate.candidate_id, 0)
        prompt = {"prefix": prefix, "suffix": suffix}
        for row in steps:
            step = row["step"]
            if step is not None and step.refines and step.state == "done":
                result = step.result or {}
                refinements.append({
                    "round": step.round, "revision": step.plan.get("revision"),
                    "transcript": result.get("transcript", []),
                    "suffix": writer_prompt_parts(search, spec, candidate.candidate_id, step.round,
                                                  result.get("refining", ""))[1],
                    "outcome": result.get("eliminated") or f"patch {result.get('patch_sha256', '')[:12]}",
                })
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
        "report": summary, "is_winner": is_winner,
        "approval": selectors.approval_state(candidate) if is_winner else None,
        "replay": selectors.winner_replay(search) if is_winner else None,
        "can_approve": access.has_role(request.user, search.project, access.APPROVER),
        "refusals": selectors.decision_refusals(request.user, search) if is_winner else None,
        "revision_refusal": selectors.revision_refusal(request.user, search) if is_winner else "",
        "revising": is_winner and summary.get("phase") == "revise",
        "comment_form": extra.pop("comment_form", None) or CommentForm(),
        "live": _live_tail(candidate),
        **extra,
    }


# --- the live tail: what runs now for a candidate, then its receipts (htmx polling) -------------

# Candidates in these states run nothing more; their page stops polling once nothing runs.
LIVE_TAIL_DONE_STATES = ("eliminated", "not_admitted", "cancelled", "winner")
LIVE_TAIL_RECEIPTS = 5  # receipts finished since the page loaded that the box keeps showing


def _live_tail(candidate, since: int | None = None) -> dict[str, Any]:
    """What the live tail box shows: the commands running now for `candidate` (runtime_app.tails),
    the receipts written after receipt `since` (None: after the newest one now, as a page loads),
    and whether the page should keep polling. Polling marks the candidate watched, which is what
    makes its running commands write their output."""
    from django.db.models import Max

    from runtime_app import tails
    from runtime_app.models import Receipt
    from search_app.models import SearchRun

    receipts = Receipt.objects.filter(subject_type="candidate", subject_id=candidate.pk)
    if since is None:  # read before the tails: a command ending in between shows as finished
        since = receipts.aggregate(newest=Max("pk"))["newest"] or 0
    subject = ("candidate", candidate.pk)
    running = tails.tails_running(subject)
    finished = list(receipts.filter(pk__gt=since).order_by("-pk")[:LIVE_TAIL_RECEIPTS])[::-1]
    status = SearchRun.objects.filter(search_id=candidate.search_id).values_list("status", flat=True).first()
    active = bool(running) or (status in ("running", "cancelling")
                               and candidate.state not in LIVE_TAIL_DONE_STATES)
    if active:
        tails.tails_watch(subject)
    else:
        tails.tails_unwatch(subject)
    return {"running": running, "finished": finished, "since": since, "active": active}


@require_GET
def candidate_live_tail(request: HttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    """The live tail box alone, polled by the candidate page while its search runs."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    since = _id(request.GET.get("since", "0"))
    if since is None:
        return HttpResponse("since must be a receipt id (a whole number).", status=400,
                            content_type="text/plain")
    return render(request, "search_app/_live_tail.html",
                  {"search": candidate.search, "candidate": candidate, "live": _live_tail(candidate, since)})


@require_GET
def candidate_detail(request: HttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    return render(request, "search_app/candidate_detail.html", _candidate_context(request, candidate))


@require_POST
def candidate_comment(request: HttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    """Start a thread, or reply in one; a refusal comes back on the page beside the form used."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    form = CommentForm(request.POST)
    if form.is_valid():
        try:
            comment = services.comment_add(request.user, candidate, form.cleaned_data["body"],
                                           form.cleaned_data["path"], form.cleaned_data["line"],
                                           form.cleaned_data["reply_to"])
        except ValidationError as error:
            _apply_errors(form, error)
        else:
            messages.success(request, "Reply added." if comment.reply_to_id else "Comment added.")
            return redirect(reverse("candidate_detail", args=[search_id, candidate_id])
                            + f"#comment-{comment.reply_to_id or comment.pk}")
    reply_to = _id(form.data.get("reply_to", ""))
    context = _candidate_context(request, candidate, comment_form=form, reply_form_for=reply_to)
    return render(request, "search_app/candidate_detail.html", context, status=400)


@require_POST
def candidate_thread_state(request: HttpRequest, search_id: str, candidate_id: str, comment_id: int,
                           action: str) -> HttpResponse:
    """Resolve or reopen a thread; a refusal comes back on the page above the threads."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    change = services.thread_resolve if action == "resolve" else services.thread_reopen
    try:
        thread = change(request.user, candidate, comment_id)
    except ValidationError as error:
        context = _candidate_context(request, candidate, thread_error=" ".join(error.messages))
        return render(request, "search_app/candidate_detail.html", context, status=400)
    messages.success(request, f"Thread #{thread.pk} is {thread.state}.")
    return redirect(reverse("candidate_detail", args=[search_id, candidate_id]) + f"#comment-{thread.pk}")


@require_http_methods(["GET", "POST"])
def candidate_decide(request: HttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    """The confirmation (patch hash, replay, reviewer's advice), then the decision itself."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    decision = str(request.POST.get("decision") or request.GET.get("decision") or "approve")
    form = DecisionForm(request.POST or None, initial={"decision": decision,
                                                       "patch_sha256": candidate.patch_sha256})
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                services.approval_record(request.user, candidate, form.cleaned_data["decision"],
                                         form.cleaned_data["patch_sha256"], form.cleaned_data["note"])
            except ValidationError as error:
                _apply_errors(form, error)
            else:
                done = "approved" if form.cleaned_data["decision"] == "approve" else "asked for changes to"
                messages.success(request, f"You {done} {candidate.candidate_id} "
                                          f"(patch {candidate.patch_sha256[:12]}).")
                return redirect("candidate_detail", search_id=search_id, candidate_id=candidate_id)
        status = 400
    context = _candidate_context(request, candidate, decision_form=form, decision=decision)
    return render(request, "search_app/candidate_decide.html", context, status=status)


@require_POST
def search_revise(request: HttpRequest, search_id: str) -> HttpResponse:
    """Send the winner back to its writer (the form on the winner's page), then watch it live."""
    search = selectors.search_for_user(request.user, search_id)
    form = RevisionForm(request.POST)
    winner = selectors.run_summary(search)["winner"]
    back = redirect("candidate_detail", search_id=search_id, candidate_id=winner) if winner else \
        redirect("search_detail", search_id=search_id)
    if not form.is_valid():
        messages.error(request, " ".join(e for errors in form.errors.values() for e in errors))
        return back
    try:
        run = services.search_revise(request.user, search, form.cleaned_data["note"])
    except (ValidationError, PermissionDenied) as error:
        messages.error(request, " ".join(getattr(error, "messages", [str(error)])))
        return back
    messages.success(request, f"{run.reason}: follow it here.")
    return redirect("search_detail", search_id=search_id)


@require_http_methods(["GET", "POST"])
def search_merge(request: HttpRequest, search_id: str) -> HttpResponse:
    """Choose where the approved winner goes, then make the commit (never pushed)."""
    search = selectors.search_for_user(request.user, search_id)
    form = MergeForm(request.POST or None, initial={"target": "new_branch",
                                                    "branch": services.merge_branch_default(search)})
    status = 200
    if request.method == "POST":
        if form.is_valid():
            target = form.cleaned_data["target"]
            branch = form.cleaned_data["branch"] if target == "existing_branch" else \
                (form.cleaned_data["branch"] or services.merge_branch_default(search))
            try:
                merge = services.merge_create(request.user, search, target, branch)
            except ValidationError as error:
                _apply_errors(form, error)
            else:
                messages.success(request, f"Merged onto {merge.branch} as {merge.commit_sha[:12]}. "
                                          "Nothing was pushed.")
                return redirect("search_detail", search_id=search_id)
        status = 400
    summary = selectors.run_summary(search)
    winner = search.run.winner if summary["winner"] else None
    return render(request, "search_app/search_merge.html", {
        "search": search, "report": summary, "form": form, "winner": winner,
        "approval": selectors.approval_state(winner) if winner else None,
        "replay": selectors.winner_replay(search) if winner else None,
        "can_approve": access.has_role(request.user, search.project, access.APPROVER),
    }, status=status)


@require_POST
def spec_draft(request: HttpRequest) -> HttpResponse:
    """Describe a search in words: the configured model drafts the TOML, shown in the editor
    unsaved and validated like any typed text."""
    form = SpecEditorForm(request.user, initial={"project": _id(request.POST.get("project"))})
    description = request.POST.get("description", "")
    project_id = _id(request.POST.get("project"))
    project = form.fields["project"].queryset.filter(pk=project_id).first() if project_id else None
    if project is None:
        context_error = "Pick one of your projects for the draft."
    else:
        try:
            text, drafted_by = services.spec_draft_write(request.user, project, description)
        except ValidationError as error:
            context_error = " ".join(error.messages)
        else:
            messages.info(request, f"Drafted by {drafted_by}. Nothing is saved yet: read it, edit it, "
                                   "then save or freeze.")
            return _editor(request, form, text=text)
    messages.error(request, context_error)
    return _editor(request, form, text="", status=400)


# --- big patches: the part a page shows, and the download ------------------------------------

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


def _chunks(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), DOWNLOAD_CHUNK_BYTES):
        yield bytes(view[start : start + DOWNLOAD_CHUNK_BYTES])


def _diff_download(data: bytes, name: str) -> StreamingHttpResponse:
    """A diff as a file to save, streamed in chunks: never rendered or sniffed as a page."""
    response = StreamingHttpResponse(_chunks(data), content_type="text/x-diff")
    response["Content-Disposition"] = f'attachment; filename="{_FILE_NAME_UNSAFE.sub("_", name)}.diff"'
    response["Content-Length"] = str(len(data))
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_GET
def candidate_patch(request: HttpRequest, search_id: str, candidate_id: str) -> StreamingHttpResponse:
    """The candidate's whole patch, byte for byte, as a text/x-diff attachment."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    return _diff_download(bytes(candidate.patch or b""),
                          f"{candidate.search.search_id}-{candidate.candidate_id}")


# --- comparing candidates ---------------------------------------------------------------------

@require_GET
def search_compare(request: HttpRequest, search_id: str) -> HttpResponse:
    """Two to four candidates of a search side by side (`?c=cand_001&c=baseline`, in that order),
    `diff=1` for the rows that differ only, and the diff from the first one's patched tree to the
    second's. A bad pick shows the problems and the picker again (status 400); the number of
    queries does not depend on the population."""
    search = selectors.search_for_user(request.user, search_id)
    choices = selectors.compare_choices(search)
    requested = request.GET.getlist("c")[:100]
    differences_only = request.GET.get("diff") == "1"
    picked_ids, problems = ([], [])
    if requested:
        picked_ids, problems = selectors.compare_pick(requested, [c.candidate_id for c in choices])
    candidates = selectors.compare_candidates(search, picked_ids) if picked_ids else []
    query = [("c", candidate_id) for candidate_id in picked_ids]
    context: dict[str, Any] = {
        "search": search, "choices": choices, "problems": problems, "checked": set(requested),
        "differences_only": differences_only, "candidates": [], "rows": [], "diff": None,
        "min_picked": selectors.COMPARE_MIN, "max_picked": selectors.COMPARE_MAX,
        "large_lines": selectors.COMPARE_LARGE_FILE_LINES,
        "toggle_url": f"{request.path}?{urlencode(query + ([] if differences_only else [('diff', '1')]))}",
    }
    if candidates:
        rows = selectors.compare_rows(search, candidates, paired=selectors.search_paired(search))
        diff = selectors.compare_tree_diff(search, candidates[0], candidates[1])
        shown = patch_shown(diff["text"].encode())
        context.update(
            candidates=[{"candidate": c, "url": reverse("candidate_detail", args=[search_id, c.candidate_id])}
                        for c in candidates],
            rows=[row for row in rows if not (differences_only and row["same"])],
            hidden_rows=sum(1 for row in rows if row["same"]) if differences_only else 0,
            diff=diff, diff_shown=shown, diff_truncated=diff["truncated"] or shown["truncated"],
            diff_files=selectors.compare_diff_files(shown["text"]),
            diff_limit_mb=selectors.COMPARE_DIFF_MAX_BYTES / 1_000_000,
            diff_download_url=f"{reverse('search_compare_diff', args=[search_id])}?{urlencode(query)}",
        )
    return render(request, "search_app/compare.html", context, status=400 if problems else 200)


@require_GET
def search_compare_diff(request: HttpRequest, search_id: str) -> HttpResponse:
    """The whole diff from the first picked candidate's patched tree to the second's (the one
    the compare page cuts), as a text/x-diff attachment."""
    search = selectors.search_for_user(request.user, search_id)
    known = [c.candidate_id for c in selectors.compare_choices(search)]
    picked_ids, problems = selectors.compare_pick(request.GET.getlist("c")[:100], known)
    if problems:
        return HttpResponse(" ".join(problems), status=400, content_type="text/plain; charset=utf-8")
    first, second = selectors.compare_candidates(search, picked_ids)[:2]
    diff = selectors.compare_tree_diff(search, first, second, limit=sys.maxsize)
    if diff["error"]:
        return HttpResponse(f"The diff cannot be made: {diff['error']}", status=409,
                            content_type="text/plain; charset=utf-8")
    return _diff_download(diff["text"].encode(),
                          f"{search.search_id}-{first.candidate_id}-{second.candidate_id}")


@csrf_exempt  # token auth per search, no cookie is read
@login_not_required
@require_http_methods(["GET", "POST"])
def search_git(request: HttpRequest, search_id: str, rest: str) -> HttpResponse:
    """Read-only git smart HTTP of a search's baseline, for workers (search_app/git_http.py)."""
    return git_respond(request, search_id, rest)
