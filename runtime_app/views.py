"""Pages of runtime_app: thin views over selectors and services."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import SetPasswordForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.template import engines
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from runtime_app import access, invitations, notifications, selectors, services
from runtime_app.forms import (
    ApiTokenForm,
    AuditFilterForm,
    MemberAddForm,
    MemberRoleForm,
    NotificationSettingForm,
    ProjectForm,
    RepositoryForm,
    RepositoryRefForm,
    WebhookForm,
    form_errors_apply,
)
from runtime_app.htmx import for_htmx, wants_partial
from runtime_app.models import ProjectRole, Webhook
from runtime_app.subjects import subject_labels_attach
from runtime_app.waiting import waiting_context

logger = logging.getLogger(__name__)


def _role_badges(user: Any) -> list[str]:
    """'alpha: operator' for each project the user is a member of."""
    return [f"{project}: {access.role_label(role)}" for project, role in access.roles_of(user).items()]


def _home(request: HttpRequest, project_form: ProjectForm, status: int = 200) -> HttpResponse:
    return render(request, "runtime_app/home.html", {
        "projects": selectors.projects_for_user(request.user),
        "project_form": project_form,
        "can_create_project": access.can_create_project(request.user),
        "roles": _role_badges(request.user),
        **waiting_context(request.user),
        **selectors.live_feed(request.user),
    }, status=status)


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return _home(request, ProjectForm())


@require_POST
def project_create(request: HttpRequest) -> HttpResponse:
    form = ProjectForm(request.POST)
    if form.is_valid():
        try:
            project = services.project_create(
                request.user, form.cleaned_data["name"], form.cleaned_data["description"]
            )
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, f"Project {project.name} created.")
            return redirect("project_detail", project_id=project.pk)
    return _home(request, form, status=400)


@require_GET
def project_detail(request: HttpRequest, project_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    return render(request, "runtime_app/project_detail.html", {
        "project": project,
        **selectors.project_hub(request.user, project),
        "memberships": project.memberships.select_related("user").order_by("user__username"),
        "pending_invitations": invitations.invitations_pending(project).count(),
        "can_operate": access.has_role(request.user, project, access.OPERATOR),
        "can_admin": access.has_role(request.user, project, access.ADMIN),
        "can_manage_webhooks": notifications.project_admin_is(request.user, project),
        **selectors.live_feed(request.user, subject=("project", project.pk)),
    })


INVITATION_LINK_KEY = "crucible_invitation_link"


def _members_page(request: HttpRequest, project: Any, form: MemberAddForm | None = None,
                  status: int = 200) -> HttpResponse:
    can_admin = access.has_role(request.user, project, access.ADMIN)
    # The link of an invitation just made or resent: shown once, then gone from the session.
    shown = request.session.get(INVITATION_LINK_KEY) if request.method == "GET" else None
    if shown and shown.get("project") == project.pk:
        del request.session[INVITATION_LINK_KEY]
    else:
        shown = None
    return render(request, "runtime_app/project_members.html", {
        "project": project,
        "memberships": selectors.project_memberships(project),
        "invitations": [(invitation, invitations.invitation_status(invitation))
                        for invitation in invitations.invitations_pending(project)],
        "invitation_link": shown,
        "invitation_days": invitations.INVITATION_DAYS,
        "can_admin": can_admin,
        "form": form or MemberAddForm(),
        "role_choices": ProjectRole.choices,
    }, status=status)


@require_GET
def project_members(request: HttpRequest, project_id: int) -> HttpResponse:
    """Who is in the project and their roles, and who is invited; a project admin adds, invites,
    changes and removes, and revokes or resends invitations."""
    return _members_page(request, selectors.project_for_user(request.user, project_id))


def _invitation_link_for(request: HttpRequest) -> invitations.LinkFor:
    def link_for(token: str) -> str:
        return request.build_absolute_uri(reverse("invitation_accept", args=[token]))
    return link_for


def _invitation_link_keep(request: HttpRequest, invitation: Any, token: str) -> None:
    """Hold the new link for the members page to show once, right after this redirect."""
    request.session[INVITATION_LINK_KEY] = {
        "project": invitation.project_id, "email": invitation.email,
        "url": _invitation_link_for(request)(token),
        "expires_at": invitation.expires_at.isoformat()}


@require_POST
def project_member_add(request: HttpRequest, project_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        who, role = form.cleaned_data["who"], form.cleaned_data["role"]
        try:
            user = services.member_account_find(who)
            if user is None:
                invitation, token = invitations.invitation_create(
                    request.user, project, who, role, link_for=_invitation_link_for(request))
            else:
                membership = services.project_member_add(request.user, project, user, role)
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            if user is None:
                _invitation_link_keep(request, invitation, token)
                messages.success(request, f"Invited {invitation.email} as {access.role_label(role)}. "
                                          "Copy the link below and send it to them (it was emailed too).")
                return redirect("project_members", project_id=project.pk)
            name = membership.user.get_username()
            if membership.role != role:
                label = access.role_label(membership.role)
                messages.info(request, f"{name} is a member already, as {label}: change their role below.")
            else:
                messages.success(request, f"{name} added as {access.role_label(role)}.")
            return redirect("project_members", project_id=project.pk)
    return _members_page(request, project, form, status=400)


def _invitation(project: Any, invitation_id: int) -> Any:
    invitation = invitations.invitation_of(project, invitation_id)
    if invitation is None:
        raise Http404("No such invitation.")
    return invitation


@require_POST
def invitation_resend(request: HttpRequest, project_id: int, invitation_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    try:
        invitation, token = invitations.invitation_resend(
            request.user, _invitation(project, invitation_id), link_for=_invitation_link_for(request))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        _invitation_link_keep(request, invitation, token)
        messages.success(request, f"Sent a new invitation link to {invitation.email}; "
                                  "the previous link no longer works.")
    return redirect("project_members", project_id=project.pk)


@require_POST
def invitation_revoke(request: HttpRequest, project_id: int, invitation_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    try:
        invitation = invitations.invitation_revoke(request.user, _invitation(project, invitation_id))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"Revoked the invitation of {invitation.email}; its link no longer works.")
    return redirect("project_members", project_id=project.pk)


@login_not_required
@require_http_methods(["GET", "POST"])
@sensitive_post_parameters()
@never_cache
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """The invitee, signed out, sets a password from the link: signed in, they land in the project.
    A link that cannot be used (unknown, replaced, revoked, expired, used) gets a page saying why."""
    invitation = invitations.invitation_for_token(token)
    refusal = invitations.invitation_refusal(invitation)
    if refusal is not None or invitation is None:
        response = render(request, "runtime_app/invitation_refused.html", {
            "refusal": refusal, "invitation": invitation}, status=404 if invitation is None else 410)
        # Django would log the 404/410 with its path, the whole token: log its first characters only.
        response._has_been_logged = True  # type: ignore[attr-defined]
        logger.warning("Invitation link refused (%d, token %.6s…): %s", response.status_code, token,
                       invitations.invitation_status(invitation) if invitation else "unknown")
    else:
        username = invitations.invitation_username(invitation.email)
        form = SetPasswordForm(get_user_model()(username=username, email=invitation.email),
                               request.POST if request.method == "POST" else None)
        if form.is_valid():
            try:
                user = invitations.invitation_accept(token, form.cleaned_data["new_password1"])
            except ValidationError as error:
                form_errors_apply(form, error)
            else:
                login(request, user, backend=settings.AUTHENTICATION_BACKENDS[0])
                messages.success(request, f"Welcome to {invitation.project.name}, {user.get_username()}: "
                                          f"you are {access.role_label(invitation.role)} here.")
                return redirect("project_detail", project_id=invitation.project_id)
        response = render(request, "runtime_app/invitation_accept.html", {
            "invitation": invitation, "username": username, "form": form,
            "invitation_days": invitations.INVITATION_DAYS,
        }, status=400 if form.errors else 200)
    # The token is in this page's URL: no other site learns it from a Referer header.
    response["Referrer-Policy"] = "same-origin"
    return response


def _member(project: Any, user_id: int) -> Any:
    membership = project.memberships.select_related("user").filter(user_id=user_id).first()
    if membership is None:
        raise Http404("No such member.")
    return membership.user


@require_POST
def project_member_role(request: HttpRequest, project_id: int, user_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    user = _member(project, user_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles.")
        return redirect("project_members", project_id=project.pk)
    try:
        services.project_member_role_set(request.user, project, user, form.cleaned_data["role"])
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"{user.get_username()} is now "
                                  f"{access.role_label(form.cleaned_data['role'])}.")
    return redirect("project_members", project_id=project.pk)


@require_POST
def project_member_remove(request: HttpRequest, project_id: int, user_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    user = _member(project, user_id)
    try:
        services.project_member_remove(request.user, project, user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("project_members", project_id=project.pk)
    messages.success(request, f"{user.get_username()} removed from {project.name}.")
    if user.pk == request.user.pk:
        return redirect("home")
    return redirect("project_members", project_id=project.pk)


@require_POST
def project_ping(request: HttpRequest, project_id: int) -> HttpResponse:
    project = selectors.project_for_user(request.user, project_id)
    services.project_ping(request.user, project)
    if wants_partial(request):  # the button's swap needs no content
        return HttpResponse(status=204)
    messages.info(request, "Ping sent; a worker's answer appears in the activity log.")
    return redirect("project_detail", project_id=project.pk)


def _repositories(request: HttpRequest, form: RepositoryForm, status: int = 200) -> HttpResponse:
    listed = selectors.repositories_for_user(request.user).order_by("project__name", "name")
    return render(request, "runtime_app/repositories.html", {
        "projects": selectors.projects_for_user(request.user).order_by("name"),
        "repositories": [(repository, selectors.repository_refs(repository)) for repository in listed],
        "form": form,
        "can_operate": access.has_role_anywhere(request.user, access.OPERATOR),
    }, status=status)


def _repository_form(request: HttpRequest, data=None) -> RepositoryForm:
    projects = access.projects_with_role(request.user, access.OPERATOR).order_by("name")
    initial = {"project": projects[0].pk} if len(projects) == 1 else {}
    return RepositoryForm(data, projects=projects, initial=initial)


@require_GET
def repositories(request: HttpRequest) -> HttpResponse:
    return _repositories(request, _repository_form(request))


@require_POST
def repository_register(request: HttpRequest) -> HttpResponse:
    form = _repository_form(request, request.POST)
    if form.is_valid():
        project = selectors.project_for_user(request.user, form.cleaned_data["project"])
        try:
            repository = services.repository_register(
                request.user, project, form.cleaned_data["path"], form.cleaned_data["name"],
                url=form.cleaned_data["url"],
            )
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, f"Repository {repository.name} registered for {project.name}.")
            return redirect("repositories")
    return _repositories(request, form, status=400)


AUDIT_PAGE_SIZE = 100
AUDIT_CSV_COLUMNS = ("when", "who", "action", "project", "target", "detail")


@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    """The audit log, filtered by GET parameters (invalid ones are shown and ignored); htmx
    requests get only the results, which is also what `?format=csv` exports, in full."""
    form = AuditFilterForm(request.GET, projects=selectors.projects_for_user(request.user).order_by("name"))
    entries = selectors.audit_entries_filtered(request.user, **form.filters())
    if request.GET.get("format") == "csv":
        return _audit_csv(request, entries)
    page = Paginator(entries, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "form": form,
        "page": page,
        "query": form.query(),
        "suggestions": selectors.audit_filter_suggestions(request.user),
        # The results block of the same template is the partial: htmx swaps in just that.
        "layout": _results_only_layout("results"),
    }
    query = form.query(page=page.number if page.number > 1 else None)
    return for_htmx(request, page="runtime_app/audit_log.html", partial="runtime_app/audit_log.html",
                    context=context, push_url=request.path + (f"?{query}" if query else ""),
                    page_context=lambda: {"layout": "base.html"})


def _results_only_layout(block: str):
    """A parent template that is only `block`: a page extending it renders just that block."""
    return engines["django"].from_string(f"{{% block {block} %}}{{% endblock %}}")


class _Echo:
    """csv.writer writes a row into this and gets the line back, for streaming."""

    def write(self, value: str) -> str:
        return value


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: str) -> str:
    """A cell a spreadsheet shows as text: one that could start a formula gets a leading quote."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _audit_csv(request: HttpRequest, entries) -> StreamingHttpResponse:
    """All entries of the filter as CSV, streamed in keyset batches (async under ASGI, so
    Daphne streams it too instead of collecting it first)."""
    writer = csv.writer(_Echo())

    def lines(batch) -> str:
        return "".join(writer.writerow([_csv_cell(cell) for cell in (
            entry.created_at.isoformat(), entry.actor_name, entry.action,
            entry.project.name if entry.project else "", entry.target,
            json.dumps(entry.detail, sort_keys=True, ensure_ascii=False),
        )]) for entry in batch)

    def rows() -> Iterator[str]:
        yield writer.writerow(AUDIT_CSV_COLUMNS)
        batch = selectors.audit_entries_batch(entries)
        while batch:
            yield lines(batch)
            batch = selectors.audit_entries_batch(entries, before_id=batch[-1].pk)

    async def rows_async() -> AsyncIterator[str]:
        read = sync_to_async(selectors.audit_entries_batch)
        yield writer.writerow(AUDIT_CSV_COLUMNS)
        batch = await read(entries)
        while batch:
            yield lines(batch)
            batch = await read(entries, before_id=batch[-1].pk)

    content = rows_async() if isinstance(request, ASGIRequest) else rows()
    response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    return response


def _notify_form(user, data=None) -> NotificationSettingForm:
    setting = notifications.notification_setting_for(user)
    initial = {"email_address": user.email, **{name: getattr(setting, name)
                                               for name in ("email", *notifications.TOPICS)}}
    return NotificationSettingForm(data, initial=initial)


def _account(request: HttpRequest, form: ApiTokenForm, notify_form: NotificationSettingForm,
             new_token: str | None = None, status: int = 200) -> HttpResponse:
    return render(request, "runtime_app/account.html", {
        "form": form,
        "notify_form": notify_form,
        "new_token": new_token,
        "tokens": selectors.api_tokens_for_user(request.user),
        "roles": _role_badges(request.user),
    }, status=status)


def account(request: HttpRequest) -> HttpResponse:
    form = ApiTokenForm(request.POST or None)
    new_token = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                _, new_token = services.api_token_create(request.user, form.cleaned_data["name"])
            except ValidationError as error:
                form_errors_apply(form, error)
        if new_token is None:
            status = 400
        else:
            form = ApiTokenForm()
    return _account(request, form, _notify_form(request.user), new_token, status)


@require_POST
def notification_settings(request: HttpRequest) -> HttpResponse:
    """The account page's notification settings: what to hear about, and where emails go."""
    form = _notify_form(request.user, request.POST)
    if form.is_valid():
        try:
            notifications.notification_setting_update(request.user, **form.cleaned_data)
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, "Notification settings saved.")
            return redirect("account")
    return _account(request, ApiTokenForm(), form, status=400)


def _webhooks(request: HttpRequest, project, form: WebhookForm, new_secret: str = "",
              status: int = 200) -> HttpResponse:
    return render(request, "runtime_app/webhooks.html", {
        "project": project,
        "form": form,
        "new_secret": new_secret,
        "webhooks": project.webhooks.all(),
        "deliveries": selectors.webhook_deliveries_recent(project),
    }, status=status)


def _project_admin_project(request: HttpRequest, project_id: int):
    project = selectors.project_for_user(request.user, project_id)
    notifications._require_project_admin(request.user, project)
    return project


def webhooks(request: HttpRequest, project_id: int) -> HttpResponse:
    """A project's outgoing webhooks (its administrators only): list, add, recent deliveries."""
    project = _project_admin_project(request, project_id)
    if request.method != "POST":
        return _webhooks(request, project, WebhookForm())
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            webhook, generated = notifications.webhook_create(request.user, project, **form.cleaned_data)
        except ValidationError as error:
            form_errors_apply(form, error)
        else:
            messages.success(request, f"Webhook {webhook.name} added.")
            if generated:  # shown on this response only, never stored in the clear
                return _webhooks(request, project, WebhookForm(), new_secret=generated)
            return redirect("webhooks", project_id=project.pk)
    return _webhooks(request, project, form, status=400)


def _webhook_of(request: HttpRequest, project_id: int, webhook_id: int) -> Webhook:
    project = _project_admin_project(request, project_id)
    webhook = project.webhooks.filter(pk=webhook_id).first()
    if webhook is None:
        raise Http404("No such webhook in this project.")
    return webhook


@require_POST
def webhook_deactivate(request: HttpRequest, project_id: int, webhook_id: int) -> HttpResponse:
    webhook = notifications.webhook_deactivate(request.user, _webhook_of(request, project_id, webhook_id))
    messages.success(request, f"Webhook {webhook.name} deactivated.")
    return redirect("webhooks", project_id=project_id)


@require_POST
def webhook_delete(request: HttpRequest, project_id: int, webhook_id: int) -> HttpResponse:
    webhook = _webhook_of(request, project_id, webhook_id)
    notifications.webhook_delete(request.user, webhook)
    messages.success(request, f"Webhook {webhook.name} deleted.")
    return redirect("webhooks", project_id=project_id)


@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = services.api_token_revoke(request.user, token_id)
    except ValidationError as error:
        raise PermissionDenied(" ".join(error.messages)) from error
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("account")


@require_GET
def receipt_detail(request: HttpRequest, receipt_id: int) -> HttpResponse:
    receipt = selectors.receipt_for_user(request.user, receipt_id)
    subject_labels_attach([receipt])
    return render(request, "runtime_app/receipt_detail.html", {"receipt": receipt})


@require_GET
def receipt_json(request: HttpRequest, receipt_id: int) -> HttpResponse:
    receipt = selectors.receipt_for_user(request.user, receipt_id)
    response = JsonResponse(receipt.as_dict(), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="receipt-{receipt.pk}.json"'
    return response


@require_GET
def repository_detail(request: HttpRequest, repository_id: int) -> HttpResponse:
    """A repository: its refs, the latest commits of the chosen branch or tag (`?ref=`, one of
    its refs; anything else falls back to the checked-out branch) and its searches."""
    repository = selectors.repository_for_user(request.user, repository_id)
    refs = selectors.repository_refs(repository)
    form = RepositoryRefForm(request.GET if "ref" in request.GET else None,
                             branches=refs["branches"], tags=refs["tags"])
    names = refs["branches"] + refs["tags"]
    default = refs["head"] if refs["head"] in refs["branches"] else next(iter(names), "")
    ref = form.cleaned_data["ref"] if form.is_valid() else default
    ref_errors = form.errors.get("ref", [])
    # The picker shows the ref whose history is shown, also after a bad choice.
    form = RepositoryRefForm(initial={"ref": ref}, branches=refs["branches"], tags=refs["tags"])
    history = selectors.repository_commits(repository, ref) if ref else {"commits": [], "error": ""}
    return render(request, "runtime_app/repository_detail.html", {
        "repository": repository,
        "refs": refs,
        "ref": ref,
        "form": form,
        "ref_errors": ref_errors,
        "history": history,
        "searches": selectors.repository_searches(repository),
        "can_operate": access.has_role(request.user, repository.project, access.OPERATOR),
    })
