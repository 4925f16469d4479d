"""Pages of search_app: the searches list, the spec editor, spec diffs and frozen searches.

Thin views: reads go through selectors (404 for outsiders), writes through services
(PermissionDenied → 403, ValidationError → the page again with the problems, status 400), and
what a page shows of them is built in search_app/presenters.py.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import push_url

from runtime_app import access
from runtime_app import selectors as runtime_selectors
from runtime_app.forms import form_errors_apply
from runtime_app.htmx import for_htmx, wants_partial
from runtime_app.presenters import short_sha
from runtime_app.selectors import repository_for_user, repository_refs
from search_app import presenters, selectors, services
from search_app.diffs import diff_rows
from search_app.diffs import spec_diff as spec_diff_text
from search_app.execution import search_spec
from search_app.forms import (
    CommentForm,
    DecisionForm,
    MergeForm,
    RevisionForm,
    SearchListForm,
    SpecDiffForm,
    SpecEditorForm,
    normalize_newlines,
)
from search_app.git_http import git_respond
from search_app.models import Approval, Merge, Search, Spec, Step
from search_app.preflight import provider_problems
from search_app.spec_templates import spec_template_get
from search_app.status import spec_statuses_set

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django_htmx.middleware import HtmxDetails

    class HtmxHttpRequest(HttpRequest):
        """A request through django-htmx's middleware, which sets `request.htmx`."""

        htmx: HtmxDetails

    class AuthenticatedHttpRequest(HttpRequest):
        """A request past LoginRequiredMiddleware (every view but search_git): a signed-in person's."""

        user: User


DOWNLOAD_CHUNK_BYTES = 64 * 1024
_FILE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _id(value: Any) -> int | None:
    """A database id from a query or form value, or None for anything else."""
    text = str(value if value is not None else "")
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


# --- the searches list ------------------------------------------------------------------------


@require_GET
def search_list(request: HtmxHttpRequest) -> HttpResponse:
    """The searches the user can see as a run table, filtered and sorted by the query string.

    An htmx request (the filter form, a heading, the refresh while something runs) gets only
    the rows partial; the full page includes the same partial.
    """
    filters = SearchListForm(request.user, request.GET).filters()
    context = presenters.search_list(request.user, filters)
    return for_htmx(
        request, page="search_app/search_list.html", partial="search_app/_search_rows.html", context=context,
        # the address bar gets the tidy URL, not `?q=&status=…`
        push_url=context["list_url"] if request.htmx.trigger == "search-filters" else None,
        page_context=lambda: {
            "form": SearchListForm(request.user, initial={
                "status": filters["status"], "outcome": filters["outcome"], "project": filters["project"],
                "q": filters["text"],
            }),
            "specs": spec_statuses_set(list(selectors.spec_list_for_user(request.user)[:200])),
        },
    )


# --- the validation partial -------------------------------------------------------------------


@require_POST
def spec_validate_partial(request: HttpRequest) -> HttpResponse:
    """HTMX: validate the editor's text as the user types and, with a repository and baseline
    chosen (the form's other fields), what freezing there would refuse. Reading only."""
    text = normalize_newlines(request.POST.get("text", ""))
    repository_id = _id(request.POST.get("repository", ""))
    repository = None
    if repository_id is not None:
        try:
            repository = repository_for_user(request.user, repository_id)
        except Http404:
            repository = None  # not theirs: checked as if none were chosen
    ref = request.POST.get("ref", "")[:255]
    return render(request, "search_app/_validation.html",
                  presenters.validation_context(text, repository=repository, ref=ref))


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
    return form.repositories.filter(pk=repository_id).first()


def _editor(
    request: HttpRequest, form: SpecEditorForm, *, text: str, spec: Spec | None = None,
    version: Any = None, status: int = 200,
) -> HttpResponse:
    context = presenters.editor_context(request.user, form, text=text, spec=spec, version=version,
                                        repository=_selected_repository(form))
    return render(request, "search_app/spec_editor.html", context, status=status)


def _initial(request: HttpRequest, spec: Spec | None) -> dict[str, Any]:
    """Initial choices from the query (`?repository=3&ref=main`) or the spec's last freeze."""
    return presenters.editor_initial(request.user, spec, repository_id=_id(request.GET.get("repository")),
                                     ref=request.GET.get("ref", "")[:255])


def _editor_post(request: AuthenticatedHttpRequest, spec: Spec | None) -> HttpResponse:
    """Save a draft (`action=save`) or freeze (`action=freeze`); on a problem, the same page
    again with everything the user typed and the problems, status 400."""
    form = SpecEditorForm(request.user, request.POST, spec=spec)
    text = normalize_newlines(request.POST.get("text", ""))
    freezing = request.POST.get("action") == "freeze"
    if not form.is_valid():
        return _editor(request, form, text=text, spec=spec, status=400)
    data = form.cleaned_data
    project, repository, ref, text = data["project"], data["repository"], data["ref"].strip(), data["text"]
    title = data["title"] or presenters.title_from(text)
    previous = spec.latest if spec is not None else None
    try:
        if freezing:
            search = services.spec_draft_freeze(
                request.user, project, spec, title, text, ref, repository
            )
        else:
            saved, version = services.spec_draft_save(request.user, project, spec, title, text)
    except ValidationError as error:
        form_errors_apply(form, error)
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
    return redirect(presenters.editor_url(saved, repository, ref))


@require_http_methods(["GET", "POST"])
def spec_new(request: AuthenticatedHttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _editor_post(request, spec=None)
    template = spec_template_get(request.GET.get("template"))
    form = SpecEditorForm(request.user, initial=_initial(request, None))
    projects = form.projects
    if "repository" in form.initial:
        chosen = form.repositories.filter(pk=form.initial["repository"]).first()
        if chosen is not None:
            form.initial["project"] = chosen.project_id
    if "project" not in form.initial and len(projects) == 1:
        form.initial["project"] = projects[0].pk
    return _editor(request, form, text=template.text if template else "")


@require_http_methods(["GET", "POST"])
def spec_edit(request: AuthenticatedHttpRequest, spec_id: int) -> HttpResponse:
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
def spec_duplicate(request: AuthenticatedHttpRequest, spec_id: int) -> HttpResponse:
    spec = selectors.spec_for_user(request.user, spec_id)
    copy = services.spec_duplicate(request.user, spec)
    messages.success(request, f"Duplicated {spec.title} as {copy.title}.")
    return redirect("spec_edit", spec_id=copy.pk)


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
    context.update(old=old, new=new, rows=diff_rows(spec_diff_text(old, new)))
    return render(request, "search_app/spec_diff.html", context)


# --- frozen searches --------------------------------------------------------------------------

@require_GET
def search_detail(request: HttpRequest, search_id: str) -> HttpResponse:
    search = selectors.search_for_user(request.user, search_id)
    return render(request, "search_app/search_detail.html", {
        **presenters.search_record(search),
        **_run_card(request, search),
        **runtime_selectors.live_feed(request.user, subject=("search", search.pk)),
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


def _page_number(value: Any) -> int:
    number = _id(value)
    return number if number and number < 100_000 else 1


def _table(request: HttpRequest, search: Search) -> dict[str, Any]:
    """The candidate table as the query string sorts, filters and pages it."""
    return presenters.candidate_table(search, sort=str(request.GET.get("sort", "number"))[:20],
                                      state=str(request.GET.get("state", ""))[:20],
                                      page=_page_number(request.GET.get("page")))


def _run_card(request: HttpRequest, search: Search) -> dict[str, Any]:
    card = presenters.run_card(search, request.user,
                               can_operate=access.may_operate(request.user, search.project),
                               can_approve=access.has_role(request.user, search.project, access.APPROVER))
    return {**card, **_table(request, search)}


@require_GET
def search_run_partial(request: HttpRequest, search_id: str) -> HttpResponse:
    """The run card alone (summary, funnel, plot and the candidate table)."""
    search = selectors.search_for_user(request.user, search_id)
    return render(request, "search_app/_run.html", _run_card(request, search))


@require_GET
def search_candidates(request: HttpRequest, search_id: str) -> HttpResponse:
    """The candidate table, sorted, filtered and paged from the query string (htmx or not)."""
    search = selectors.search_for_user(request.user, search_id)
    url = reverse("search_detail", args=[search.search_id])
    if wants_partial(request):  # the address bar shows the search page with the table's state
        context = _table(request, search)
        response = render(request, "search_app/_candidates.html", context)
        return push_url(response, f"{url}?{context['table_query']}" if context["table_query"] else url)
    query = request.GET.urlencode()
    return redirect(f"{url}?{query}#candidates" if query else url)


@require_POST
def search_start(request: AuthenticatedHttpRequest, search_id: str) -> HttpResponse:
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
def search_cancel(request: AuthenticatedHttpRequest, search_id: str) -> HttpResponse:
    """The confirmation (what stops, what is kept), then the cancel itself."""
    search = selectors.search_for_user(request.user, search_id)
    if request.method == "GET":
        return render(request, "search_app/search_cancel.html", {
            "search": search, "report": selectors.run_summary(search),
            "running": search.steps.filter(state=Step.State.RUNNING).count(),
            "can_operate": access.may_operate(request.user, search.project)})
    try:
        services.search_cancel(request.user, search)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"{search.search_id}: cancelling; running steps are being stopped.")
    return redirect("search_detail", search_id=search.search_id)


# --- candidates, review, approval and merge ---------------------------------------------------

@require_GET
def candidate_live_tail(request: HttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    """The live tail box alone, polled by the candidate page while its search runs."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    since = _id(request.GET.get("since", "0"))
    if since is None:
        return HttpResponse("since must be a receipt id (a whole number).", status=400,
                            content_type="text/plain")
    live = presenters.live_tail(candidate, since)
    return render(request, "search_app/_live_tail.html",
                  {"search": candidate.search, "candidate": candidate, "live": live})


@require_GET
def candidate_detail(request: HttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    context = presenters.candidate_page(request.user, candidate)
    return render(request, "search_app/candidate_detail.html", context)


@require_POST
def candidate_comment(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    """Start a thread, or reply in one; a refusal comes back on the page beside the form used."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    form = CommentForm(request.POST)
    if form.is_valid():
        try:
            comment = services.comment_add(request.user, candidate, form.cleaned_data["body"],
                                           form.cleaned_data["path"], form.cleaned_data["line"],
                                           form.cleaned_data["reply_to"], form.cleaned_data["side"])
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, "Reply added." if comment.reply_to_id else "Comment added.")
            return redirect(reverse("candidate_detail", args=[search_id, candidate_id])
                            + f"#comment-{comment.reply_to_id or comment.pk}")
    reply_to = _id(form.data.get("reply_to", ""))
    context = presenters.candidate_page(request.user, candidate, comment_form=form, reply_form_for=reply_to)
    return render(request, "search_app/candidate_detail.html", context, status=400)


@require_POST
def candidate_thread_state(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str,
                           comment_id: int, action: str) -> HttpResponse:
    """Resolve or reopen a thread; a refusal comes back on the page above the threads."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    change = services.thread_resolve if action == "resolve" else services.thread_reopen
    try:
        thread = change(request.user, candidate, comment_id)
    except ValidationError as error:
        context = presenters.candidate_page(request.user, candidate, thread_error=" ".join(error.messages))
        return render(request, "search_app/candidate_detail.html", context, status=400)
    messages.success(request, f"Thread #{thread.pk} is {thread.state}.")
    return redirect(reverse("candidate_detail", args=[search_id, candidate_id]) + f"#comment-{thread.pk}")


@require_http_methods(["GET", "POST"])
def candidate_decide(request: AuthenticatedHttpRequest, search_id: str, candidate_id: str) -> HttpResponse:
    """The confirmation (patch hash, replay, reviewer's advice), then the decision itself."""
    candidate = selectors.candidate_for_user(request.user, search_id, candidate_id)
    decision = str(request.POST.get("decision") or request.GET.get("decision") or Approval.Decision.APPROVE)
    form = DecisionForm(request.POST or None, initial={"decision": decision,
                                                       "patch_sha256": candidate.patch_sha256})
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                services.approval_record(request.user, candidate, form.cleaned_data["decision"],
                                         form.cleaned_data["patch_sha256"], form.cleaned_data["note"])
            except ValidationError as error:
                form_errors_apply(form, error)
            else:
                approved = form.cleaned_data["decision"] == Approval.Decision.APPROVE
                done = "approved" if approved else "asked for changes to"
                messages.success(request, f"You {done} {candidate.candidate_id} "
                                          f"(patch {short_sha(candidate.patch_sha256)}).")
                return redirect("candidate_detail", search_id=search_id, candidate_id=candidate_id)
        status = 400
    context = presenters.candidate_page(request.user, candidate, decision_form=form, decision=decision)
    return render(request, "search_app/candidate_decide.html", context, status=status)


@require_POST
def search_revise(request: AuthenticatedHttpRequest, search_id: str) -> HttpResponse:
    """Send the winner back to its writer (the form on the winner's page), then watch it live."""
    search = selectors.search_for_user(request.user, search_id)
    form = RevisionForm(request.POST)
    winner = selectors.run_summary(search)["winner"]
    back = redirect("candidate_detail", search_id=search_id, candidate_id=winner) if winner else \
        redirect("search_detail", search_id=search_id)
    if not form.is_valid():
        messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
        return back
    try:
        run = services.search_revise(request.user, search, form.cleaned_data["note"])
    except (ValidationError, PermissionDenied) as error:
        messages.error(request, " ".join(getattr(error, "messages", [str(error)])))
        return back
    messages.success(request, f"{run.reason}: follow it here.")
    return redirect("search_detail", search_id=search_id)


@require_http_methods(["GET", "POST"])
def search_merge(request: AuthenticatedHttpRequest, search_id: str) -> HttpResponse:
    """Choose where the approved winner goes, then make the commit (never pushed)."""
    search = selectors.search_for_user(request.user, search_id)
    form = MergeForm(request.POST or None, initial={"target": Merge.Target.NEW_BRANCH,
                                                    "branch": services.merge_branch_default(search)})
    status = 200
    if request.method == "POST":
        if form.is_valid():
            target = form.cleaned_data["target"]
            branch = form.cleaned_data["branch"] if target == Merge.Target.EXISTING_BRANCH else \
                (form.cleaned_data["branch"] or services.merge_branch_default(search))
            try:
                merge = services.merge_create(request.user, search, target, branch)
            except ValidationError as error:
                form_errors_apply(form, error)
            else:
                messages.success(request, f"Merged onto {merge.branch} as {short_sha(merge.commit_sha)}. "
                                          "Nothing was pushed.")
                return redirect("search_detail", search_id=search_id)
        status = 400
    return render(request, "search_app/search_merge.html", presenters.merge_page(request.user, search, form),
                  status=status)


@require_POST
def spec_draft(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Describe a search in words: the configured model drafts the TOML, shown in the editor
    unsaved and validated like any typed text."""
    form = SpecEditorForm(request.user, initial={"project": _id(request.POST.get("project"))})
    description = request.POST.get("description", "")
    project_id = _id(request.POST.get("project"))
    project = form.projects.filter(pk=project_id).first() if project_id else None
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


# --- big patches: the download ------------------------------------------------------------


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
    context = presenters.compare_page(search, request.path, request.GET.getlist("c")[:100],
                                      differences_only=request.GET.get("diff") == "1")
    return render(request, "search_app/compare.html", context, status=400 if context["problems"] else 200)


@require_GET
def search_compare_diff(request: HttpRequest, search_id: str) -> HttpResponse | StreamingHttpResponse:
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
