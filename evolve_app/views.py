"""Pages of evolve_app: agents, their versions and files at any snapshot, evolution runs, cycles.

Thin views: reads go through selectors (404 for outsiders), writes through services
(PermissionDenied → 403, ValidationError → the page again with the problems, status 400, or a
message when the page has no form for it).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from evolve_app import presenters, selectors, services
from evolve_app.forms import (
    AgentImportConfirmForm,
    AgentImportForm,
    CompareForm,
    CycleDecisionForm,
    DemoAgentForm,
    RollbackForm,
    RunStartForm,
    setting_label,
)
from evolve_app.models import Agent, EvolutionRun
from evolve_app.status import last_run_statuses, run_status_of, run_statuses
from evolve_app.types import AuthedRequest
from runtime_app import access
from runtime_app import selectors as runtime_selectors
from runtime_app.forms import form_errors_apply
from runtime_app.models import Project
from runtime_app.presenters import short_sha
from runtime_app.selectors import project_for_user, projects_for_user

# --- the agents list --------------------------------------------------------------------------

def _agent_list(request: AuthedRequest, *, import_form: AgentImportForm | None = None,
                demo_form: DemoAgentForm | None = None, status: int = 200) -> HttpResponse:
    projects = projects_for_user(request.user).order_by("name")
    single = {"project": projects[0].pk} if len(projects) == 1 else {}
    agents = list(selectors.agent_list_rows(request.user))
    presenters.last_run_labels_set(agents, last_run_statuses(agents))
    return render(request, "evolve_app/agent_list.html", {
        "agents": agents,
        "projects": projects,
        "import_form": import_form or AgentImportForm(projects=projects, initial=single),
        "demo_form": demo_form or DemoAgentForm(projects=projects, initial=single),
        "can_operate": access.may_operate(request.user),
    }, status=status)


@require_GET
def agent_list(request: AuthedRequest) -> HttpResponse:
    return _agent_list(request)


@require_POST
def agent_import(request: AuthedRequest) -> HttpResponse:
    """Import a workspace folder; a workspace with problems comes back with every one of them
    (`file:line: message`) under the path; a folder without manifest.yaml goes to its preview."""
    projects = projects_for_user(request.user).order_by("name")
    form = AgentImportForm(request.POST, projects=projects)
    if form.is_valid():
        project = project_for_user(request.user, form.cleaned_data["project"])
        try:
            agent = services.agent_import(request.user, project, form.cleaned_data["path"],
                                          form.cleaned_data["name"])
        except services.ManifestMissing:
            query = urlencode({key: form.cleaned_data[key] for key in ("project", "path", "name")})
            return redirect(reverse("agent_import_preview") + "?" + query)
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            return _imported(request, agent, project)
    return _agent_list(request, import_form=form, status=400)


def _imported(request: AuthedRequest, agent: Agent, project: Project) -> HttpResponse:
    if agent.import_note:
        messages.info(request, agent.import_note)
    else:
        messages.success(request, f"Agent {agent.name} imported into {project.name}: a copy of "
                                  f"{agent.source_path or agent.path}, which is never written.")
        if agent.import_warnings:
            count = len(agent.import_warnings)
            messages.warning(request, f"{count} import warning{'s' if count != 1 else ''}: see “Import "
                                      "warnings” below.")
    for warning in selectors.agent_manifest(agent)["manifest_warnings"]:
        messages.warning(request, f"warning: {warning}")
    return redirect("agent_detail", agent_id=agent.pk)


@require_http_methods(["GET", "POST"])
def agent_import_preview(request: AuthedRequest) -> HttpResponse:
    """A folder without manifest.yaml: the manifest Crucible infers, to confirm or edit (GET),
    then the import with it (POST). A refused import comes back with every problem."""
    data = request.POST if request.method == "POST" else request.GET
    form = AgentImportConfirmForm(data if request.method == "POST" else None, initial={
        key: str(data.get(key, ""))[:1000] for key in ("project", "path", "name")})
    try:
        project = project_for_user(request.user, int(str(data.get("project", ""))))
    except ValueError:
        raise Http404("No such project.") from None
    path = str(data.get("path", ""))[:1000]
    status = 200
    if request.method == "POST" and form.is_valid():
        try:
            agent = services.agent_import(request.user, project, path, form.cleaned_data["name"],
                                          manifest=form.cleaned_data["manifest"])
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            return _imported(request, agent, project)
    if request.method == "POST":
        status = 400
    try:
        preview = selectors.import_preview(request.user, project, path)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("agent_list")
    if preview.has_manifest and request.method == "GET":
        messages.info(request, f"{preview.path} has its own manifest.yaml: import it from this page.")
        return redirect(reverse("agent_list") + "#agent-import")
    if request.method == "GET":
        form.initial["manifest"] = preview.manifest
    return render(request, "evolve_app/agent_import_preview.html", {
        "project": project, "preview": preview, "form": form}, status=status)


@require_POST
def agent_demo(request: AuthedRequest) -> HttpResponse:
    """A fresh copy of the offline demo workspace, imported as an agent of the chosen project."""
    projects = projects_for_user(request.user).order_by("name")
    form = DemoAgentForm(request.POST, projects=projects)
    if form.is_valid():
        project = project_for_user(request.user, form.cleaned_data["project"])
        try:
            agent = services.demo_agent_create(request.user, project)
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, f"{agent.name} created in {project.name}: start an evolution run "
                                      "below.")
            return redirect("agent_detail", agent_id=agent.pk)
    return _agent_list(request, demo_form=form, status=400)


# --- one agent --------------------------------------------------------------------------------

def _browser_context(request: AuthedRequest, agent: Agent, versions: list[dict[str, Any]]) -> dict[str, Any]:
    """The skills and memory browser: `?ref=` is one of the version log's tags (or HEAD), else
    HEAD with a note; `?skill=` is one of the skills at that ref, else none."""
    choices = selectors.ref_choices(versions)
    asked = str(request.GET.get("ref", "") or "")[:100]
    ref, note = "HEAD", ""
    if asked and asked in choices:
        ref = asked
    elif asked:
        note = f"There is no snapshot called “{asked}”: showing the current files (HEAD)."
    skill = str(request.GET.get("skill", "") or "")[:100]
    browser = selectors.workspace_at(agent, ref, skill)
    if skill and browser["skill"] is None and not browser["error"]:
        note = note or f"There is no skill called “{skill}” at {ref}."
    return {"browser": browser, "browser_ref": ref, "browser_refs": choices, "browser_note": note}


def _rollback_tags(versions: list[dict[str, Any]]) -> list[str]:
    """The `evo-K` snapshots a workspace can roll back to, newest first."""
    return [v["tag"] for v in reversed(versions) if v["kind"] == "post"]


def _with_states(runs: list[Any]) -> list[Any]:
    """Each run with its `state`: the one status people read (evolve_app/status.py)."""
    states = run_statuses(runs)
    for run in runs:
        run.state = states[run.pk]  # type: ignore[attr-defined]
    return runs


def _agent_page(request: AuthedRequest, agent: Agent, *, start_form: RunStartForm | None = None,
                rollback_form: RollbackForm | None = None, status: int = 200) -> HttpResponse:
    logged = selectors.agent_versions(agent)
    versions = logged["versions"]
    for before, version in zip([None, *versions], versions, strict=False):
        version["previous"] = before["tag"] if before else ""  # its "changes" link diffs from it
    tags = _rollback_tags(versions)
    runs = list(selectors.agent_runs(agent))
    found = [entry for entry in agent.import_warnings or [] if isinstance(entry, dict)]
    return render(request, "evolve_app/agent_detail.html", {
        "agent": agent,
        "import_inferred": [entry for entry in found if entry.get("kind") != "unused"],
        "import_unused": [entry for entry in found if entry.get("kind") == "unused"],
        **selectors.agent_manifest(agent),
        "runs_as": selectors.agent_runs_as(agent),
        "versions": versions, "versions_error": logged["error"], "head": logged["head"],
        "runs": _with_states(runs),
        "active_run": next((run for run in runs if run.status in EvolutionRun.ACTIVE), None),
        "start_form": start_form or RunStartForm(agent_path=agent.path),
        "rollback_form": rollback_form or RollbackForm(tags=tags),
        "can_operate": access.may_operate(request.user, agent.project),
        "can_approve": access.has_role(request.user, agent.project, access.APPROVER),
        **_browser_context(request, agent, versions),
        "compare_form": _compare_form_default(selectors.workspace_refs(agent, versions)["refs"]),
        "empty_message": "No activity for this agent yet.",
        **runtime_selectors.live_feed(request.user, subject=("agent", agent.pk)),
    }, status=status)


@require_GET
def agent_file(request: AuthedRequest, agent_id: int) -> HttpResponse:
    """One file of the workspace at `?ref=` (HEAD or any tag), as a download: what a page shows
    only the beginning of. Symlinks, paths outside the workspace and outsiders get 404."""
    agent = selectors.agent_for_user(request.user, agent_id)
    name, data = selectors.workspace_file_bytes(agent, str(request.GET.get("ref", "HEAD"))[:200],
                                                str(request.GET.get("path", ""))[:1001])
    response = HttpResponse(data, content_type="application/octet-stream")
    response["Content-Disposition"] = content_disposition_header(True, name) or "attachment"
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_GET
def agent_detail(request: AuthedRequest, agent_id: int) -> HttpResponse:
    agent = selectors.agent_for_user(request.user, agent_id)
    return _agent_page(request, agent)


@require_POST
def evolution_run_start(request: AuthedRequest, agent_id: int) -> HttpResponse:
    agent = selectors.agent_for_user(request.user, agent_id)
    form = RunStartForm(request.POST, agent_path=agent.path)
    valid = form.is_valid()
    # With settings the form already rejected (per field), the service still runs: it refuses
    # them too, and its benchmark, engine and cycles problems are shown alongside.
    if valid or form.only_settings_rejected():
        data = form.cleaned_data
        try:
            run = services.evolution_run_start(request.user, agent, benchmark=data["benchmark"].strip(),
                                               engine=data["engine"].strip(), cycles=data["cycles"],
                                               config=form.config)
        except ValidationError as error:
            if not valid and hasattr(error, "error_dict"):  # the settings are already on their fields
                error = ValidationError({k: v for k, v in error.error_dict.items() if k != "config"})
            form_errors_apply(form, error)
        else:
            messages.success(request, f"Run {run.number} queued: {run.cycles_planned} cycles of {run.engine} "
                                      f"on {run.benchmark}.")
            return redirect(run.get_absolute_url())
    return _agent_page(request, agent, start_form=form, status=400)


@require_POST
def agent_rollback(request: AuthedRequest, agent_id: int) -> HttpResponse:
    """Roll the workspace back to an `evo-K` snapshot (approvers, after ticking the confirmation)."""
    agent = selectors.agent_for_user(request.user, agent_id)
    form = RollbackForm(request.POST, tags=_rollback_tags(selectors.agent_versions(agent)["versions"]))
    if form.is_valid():
        tag = form.cleaned_data["tag"]
        try:
            sha = services.agent_rollback(request.user, agent, tag)
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, f"{agent.name} rolled back to {tag} with the new commit "
                                      f"{short_sha(sha)}.")
            return redirect("agent_detail", agent_id=agent.pk)
    return _agent_page(request, agent, rollback_form=form, status=400)


# --- evolution runs ---------------------------------------------------------------------------

def _run_context(request: AuthedRequest, run: EvolutionRun) -> dict[str, Any]:
    cycles = selectors.run_cycles(run)
    return {
        "agent": run.agent, "run": run, "cycles": cycles, "curve": presenters.score_curve(cycles),
        "progress": presenters.run_progress(run, cycles), "run_state": run_status_of(run),
        "active": run.status in EvolutionRun.ACTIVE,
        "config_items": [(setting_label(key), key, value)
                         for key, value in sorted((run.config or {}).items())],
        "can_operate": access.may_operate(request.user, run.agent.project),
        "can_approve": access.has_role(request.user, run.agent.project, access.APPROVER),
    }


def _run_or_redirect(request: AuthedRequest, agent_id: int, run_number: int) -> EvolutionRun | HttpResponse:
    """The agent's run `run_number`; a link made when the pages named runs by database id is
    sent, for a GET, to the same page under the run's number."""
    run, by_id = selectors.run_by_number_for_user(request.user, agent_id, run_number)
    if by_id and request.method == "GET":
        old = f"/runs/{run_number}/"
        path = request.get_full_path().replace(old, f"/runs/{run.number}/", 1)
        return redirect(path)
    return run


@require_GET
def evolution_run_detail(request: AuthedRequest, agent_id: int, run_number: int) -> HttpResponse:
    run = _run_or_redirect(request, agent_id, run_number)
    if isinstance(run, HttpResponse):
        return run
    return render(request, "evolve_app/run_detail.html", {
        **_run_context(request, run),
        "empty_message": "No activity for this agent yet.",
        **runtime_selectors.live_feed(request.user, subject=("agent", run.agent.pk)),
    })


@require_GET
def evolution_run_progress(request: AuthedRequest, agent_id: int, run_number: int) -> HttpResponse:
    """The run's status, score curve and cycle timeline (what the page refreshes while it runs)."""
    run = _run_or_redirect(request, agent_id, run_number)
    if isinstance(run, HttpResponse):
        return run
    return render(request, "evolve_app/_run_progress.html", _run_context(request, run))


@require_http_methods(["GET", "POST"])
def evolution_run_cancel(request: AuthedRequest, agent_id: int, run_number: int) -> HttpResponse:
    """The confirmation (what stops, what is kept), then the cancel itself."""
    run = _run_or_redirect(request, agent_id, run_number)
    if isinstance(run, HttpResponse):
        return run
    if request.method == "GET":
        return render(request, "evolve_app/run_cancel.html", {
            "agent": run.agent, "run": run, "active": run.status in EvolutionRun.ACTIVE,
            "cycles_done": run.cycles.count(),
            "can_operate": access.may_operate(request.user, run.agent.project)})
    try:
        services.evolution_run_cancel(request.user, run)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"Run {run.number} cancelled: it stops after the step it is on.")
    return redirect(run.get_absolute_url())


# --- cycles -----------------------------------------------------------------------------------

@require_GET
def cycle_detail(request: AuthedRequest, agent_id: int, run_number: int, number: int) -> HttpResponse:
    found = _run_or_redirect(request, agent_id, run_number)
    if isinstance(found, HttpResponse):
        return found
    cycle = selectors.cycle_of_run(found, number)
    run, agent = cycle.run, cycle.run.agent
    failures = request.GET.get("failures") == "1"
    diff = selectors.cycle_diff(agent, cycle)
    return render(request, "evolve_app/cycle_detail.html", {
        "agent": agent, "run": run, "cycle": cycle, "diff": diff, "patch_text": diff["text"],
        "engine_metadata": json.dumps(cycle.engine_metadata, indent=2, ensure_ascii=False, sort_keys=True)
        if cycle.engine_metadata else "",
        "observations": selectors.cycle_observations(cycle, failures=failures), "failures": failures,
        **_neighbours(run, number),
        "can_approve": access.has_role(request.user, agent.project, access.APPROVER),
    })


def _neighbours(run: EvolutionRun, number: int) -> dict[str, int | None]:
    numbers = set(run.cycles.filter(number__in=(number - 1, number + 1)).values_list("number", flat=True))
    return {"previous_number": number - 1 if number - 1 in numbers else None,
            "next_number": number + 1 if number + 1 in numbers else None}


@require_POST
def cycle_decide(request: AuthedRequest, agent_id: int, run_number: int, number: int) -> HttpResponse:
    """Review mode: approve (the run goes on) or reject (back to pre-evo-N) a waiting mutation."""
    cycle = selectors.cycle_by_number_for_user(request.user, agent_id, run_number, number)
    form = CycleDecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve or reject.")
    else:
        approve = form.cleaned_data["decision"] == "approve"
        try:
            services.cycle_decide(request.user, cycle, approve)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            done = ("approved: the run goes on" if approve
                    else f"rejected: the workspace is back at pre-evo-{number}")
            messages.success(request, f"Cycle {number} {done}.")
    run_url = cycle.run.get_absolute_url()
    if request.POST.get("back") == "cycle":
        return redirect(f"{run_url}cycles/{number}/")
    return redirect(run_url + "#timeline")


# --- the workspace at any tag: every file, and the diff between any two tags --------------------

def _compare_form_default(refs: list[str]) -> CompareForm:
    """A compare form from the snapshot before the newest to HEAD (refs: HEAD, then newest first)."""
    base = refs[2] if len(refs) > 2 else refs[-1]
    return CompareForm(refs=refs, initial={"base": base, "head": "HEAD"})


@require_GET
def agent_compare(request: AuthedRequest, agent_id: int) -> HttpResponse:
    """The diff between two refs of the workspace (HEAD or any tag) chosen in `?base=&head=`,
    in the search pages' diff viewer; a ref that is not there is named on the form (status 400)."""
    agent = selectors.agent_for_user(request.user, agent_id)
    refs = selectors.workspace_refs(agent)
    form = CompareForm(request.GET or None, refs=refs["refs"])
    if not request.GET:
        form = _compare_form_default(refs["refs"])
    diff = None
    if form.is_bound and form.is_valid():
        diff = selectors.workspace_compare(agent, form.cleaned_data["base"], form.cleaned_data["head"])
    return render(request, "evolve_app/agent_compare.html", {
        "agent": agent, "form": form, "diff": diff, "refs_error": refs["error"],
        "patch_text": diff["text"] if diff else "",
    }, status=400 if form.is_bound and not form.is_valid() else 200)


@require_GET
def agent_files(request: AuthedRequest, agent_id: int) -> HttpResponse:
    """Every file of the workspace at `?ref=` (HEAD or any tag): the folder or file at `?path=`.
    A ref that is not there, or a path that is not there or could leave the workspace, is a 404."""
    agent = selectors.agent_for_user(request.user, agent_id)
    ref = str(request.GET.get("ref", "") or "HEAD")[:200]
    refs = selectors.workspace_refs(agent)["refs"]
    browse = selectors.workspace_browse(agent, ref, str(request.GET.get("path", ""))[:1001], refs=refs)
    return render(request, "evolve_app/agent_files.html", {
        "agent": agent, "browse": browse, "browser_ref": ref, "refs": refs,
    })
