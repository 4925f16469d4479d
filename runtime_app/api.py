"""REST routes of runtime_app: the same services and selectors as the pages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest
from django.urls import reverse
from ninja import Field, Query, Router, Schema, Status

from runtime_app import access, invitations, selectors, services
from runtime_app.health import health_status
from runtime_app.presenters import NAME_MAX_LENGTH
from runtime_app.waiting import waiting_by_project, waiting_for

router = Router(tags=["runtime"])


class ProjectOut(Schema):
    id: int
    name: str
    description: str
    created_at: datetime


class ProjectIn(Schema):
    name: str = Field(..., max_length=NAME_MAX_LENGTH)
    description: str = Field("", max_length=2000)


class MeOut(Schema):
    username: str
    roles: dict[str, str] = Field(description="project name → your role there")
    can_create_projects: bool
    projects: list[ProjectOut]


class MemberOut(Schema):
    username: str
    email: str
    role: str = Field(description="viewer, operator, approver or admin (project admin)")
    added_at: datetime


class MemberIn(Schema):
    who: str = Field(..., max_length=254, description="an existing account's username or email address")
    role: str = Field("viewer", max_length=16)


class MemberRoleIn(Schema):
    role: str = Field(..., max_length=16)


class InvitationOut(Schema):
    id: int
    email: str
    role: str = Field(description="viewer, operator, approver or admin (project admin)")
    status: str = Field(description="pending, expired, accepted or revoked")
    invited_by: str
    created_at: datetime
    sent_at: datetime = Field(description="when the current link was issued")
    sends: int
    expires_at: datetime


class InvitationIssuedOut(InvitationOut):
    link: str = Field(description="the invitation link: returned this once, never stored (only its hash)")


class InvitationIn(Schema):
    email: str = Field(..., max_length=254, description="an address no account has")
    role: str = Field("viewer", max_length=16)


class EventOut(Schema):
    id: int
    project_id: int
    subject_type: str
    subject_id: int
    kind: str
    payload: dict[str, Any]
    created_at: datetime


class HealthOut(Schema):
    ok: bool
    mode: str
    checks: dict[str, dict[str, Any]]


class Accepted(Schema):
    detail: str


@router.get("/health", response={200: HealthOut, 503: HealthOut})
def health(request: HttpRequest):
    """Database, broker, channel layer and worker status; 503 when any part is down."""
    status = health_status()
    return Status(200 if status["ok"] else 503, status)


@router.get("/me", response=MeOut)
def me(request: HttpRequest):
    user = request.user
    return {
        "username": user.get_username(),
        "roles": access.roles_of(user),
        "can_create_projects": access.can_create_project(user),
        "projects": list(selectors.projects_for_user(user)),
    }


class StatusOut(Schema):
    """The one status the pages and the CLI show (docs/reviewing-and-merging.md#status-words)."""

    word: str = Field(description="drafting, frozen, running, awaiting approval, changes requested, "
                                  "approved, merged, NONE, failed or cancelled (also eliminated, finished)")
    detail: str = Field(description="the phase, \"1 of 2 approvals\", the branch, or why")
    label: str = Field(description="the one line shown everywhere: \"awaiting approval (1 of 2 approvals)\"")
    tone: str = Field(description="how the pages colour it: muted, running, pending, warn, ok, none or bad")


class WaitingItemOut(Schema):
    kind: str = Field(description="approve, merge, review, changes requested, reply or failed")
    project_id: int
    project: str
    title: str
    url: str = Field(description="the page where you act on it")
    detail: str
    status: str = Field(description="its subject's status label, as the pages show it")
    when: datetime | None
    key: str


class WaitingProjectOut(Schema):
    project_id: int
    project: str
    items: list[WaitingItemOut]


class WaitingOut(Schema):
    count: int
    projects: list[WaitingProjectOut]


@router.get("/waiting", response=WaitingOut)
def waiting(request: HttpRequest):
    """What you can act on now, per project (the home page's "Waiting for you"): winners you may
    approve or merge, evolution runs awaiting your review, changes requested on your searches'
    winners, review threads that mention you or wait for your reply, your searches that failed
    or came out NONE in the last 7 days. Nothing from projects you are not a member of."""
    items = waiting_for(request.user)
    return {"count": len(items), "projects": [
        {"project_id": group.project_id, "project": group.project,
         "items": [item.as_dict() for item in group.items]} for group in waiting_by_project(items)]}


@router.get("/projects", response=list[ProjectOut])
def project_list(request: HttpRequest):
    return selectors.projects_for_user(request.user)


@router.post("/projects", response={201: ProjectOut})
def project_create(request: HttpRequest, body: ProjectIn):
    return Status(201, services.project_create(request.user, body.name, body.description))


@router.get("/projects/{project_id}", response=ProjectOut)
def project_detail(request: HttpRequest, project_id: int):
    return selectors.project_for_user(request.user, project_id)


@router.post("/projects/{project_id}/ping", response={202: Accepted})
def project_ping(request: HttpRequest, project_id: int):
    """Ask a worker to answer with a `worker.pong` event on the project."""
    project = selectors.project_for_user(request.user, project_id)
    services.project_ping(request.user, project)
    return Status(202, {"detail": "A worker will answer with a worker.pong event."})


def _member_out(membership: Any) -> dict[str, Any]:
    user = membership.user
    return {"username": user.get_username(), "email": user.email, "role": membership.role,
            "added_at": membership.added_at}


def _member_of(project: Any, username: str) -> Any:
    membership = project.memberships.select_related("user").filter(user__username=username).first()
    if membership is None:
        raise ValidationError({"username": f"{username} is not a member of {project.name}."})
    return membership


@router.get("/projects/{project_id}/members", response=list[MemberOut])
def project_member_list(request: HttpRequest, project_id: int):
    """The project's members and their roles (any member may read them)."""
    project = selectors.project_for_user(request.user, project_id)
    return [_member_out(membership) for membership in selectors.project_memberships(project)]


@router.post("/projects/{project_id}/members", response={201: MemberOut, 200: MemberOut})
def project_member_add(request: HttpRequest, project_id: int, body: MemberIn):
    """Add an existing account (by username or email) with a role; a project admin only.
    A member already there keeps their role (200): change it with PATCH."""
    project = selectors.project_for_user(request.user, project_id)
    before = project.memberships.count()
    membership = services.member_find_and_add(request.user, project, body.who, body.role)
    return Status(201 if project.memberships.count() > before else 200, _member_out(membership))


@router.patch("/projects/{project_id}/members/{username}", response=MemberOut)
def project_member_role(request: HttpRequest, project_id: int, username: str, body: MemberRoleIn):
    """Change a member's role; a project admin only."""
    project = selectors.project_for_user(request.user, project_id)
    membership = _member_of(project, username)
    return _member_out(services.project_member_role_set(request.user, project, membership.user, body.role))


@router.delete("/projects/{project_id}/members/{username}", response={204: None})
def project_member_remove(request: HttpRequest, project_id: int, username: str):
    """Remove a member (a project admin), or leave the project yourself."""
    project = selectors.project_for_user(request.user, project_id)
    services.project_member_remove(request.user, project, _member_of(project, username).user)
    return Status(204, None)


def _invitation_out(invitation: Any, link: str | None = None) -> dict[str, Any]:
    out = {"id": invitation.pk, "email": invitation.email, "role": invitation.role,
           "status": invitations.invitation_status(invitation),
           "invited_by": invitation.invited_by.get_username() if invitation.invited_by else "",
           "created_at": invitation.created_at, "sent_at": invitation.sent_at,
           "sends": invitation.sends, "expires_at": invitation.expires_at}
    return out if link is None else {**out, "link": link}


def _link_for(request: HttpRequest) -> invitations.LinkFor:
    def link_for(token: str) -> str:
        return request.build_absolute_uri(reverse("invitation_accept", args=[token]))
    return link_for


def _invitation(request: HttpRequest, project_id: int, invitation_id: int) -> Any:
    project = selectors.project_for_user(request.user, project_id)
    invitation = invitations.invitation_of(project, invitation_id)
    if invitation is None:
        raise Http404("No such invitation.")
    return invitation


@router.get("/projects/{project_id}/invitations", response=list[InvitationOut])
def invitation_list(request: HttpRequest, project_id: int):
    """The project's pending invitations (expired ones included), as the members page lists them."""
    project = selectors.project_for_user(request.user, project_id)
    return [_invitation_out(invitation) for invitation in invitations.invitations_pending(project)]


@router.post("/projects/{project_id}/invitations", response={201: InvitationIssuedOut})
def invitation_create(request: HttpRequest, project_id: int, body: InvitationIn):
    """Invite an address no account has; a project admin only. The link is in this answer only
    (and emailed); inviting an address with a pending invitation renews it (new link)."""
    project = selectors.project_for_user(request.user, project_id)
    invitation, token = invitations.invitation_create(request.user, project, body.email, body.role,
                                                      link_for=_link_for(request))
    return Status(201, _invitation_out(invitation, _link_for(request)(token)))


@router.post("/projects/{project_id}/invitations/{invitation_id}/resend", response=InvitationIssuedOut)
def invitation_resend(request: HttpRequest, project_id: int, invitation_id: int):
    """A new link for a pending (or expired) invitation, returned once and emailed; the old one stops."""
    invitation, token = invitations.invitation_resend(
        request.user, _invitation(request, project_id, invitation_id), link_for=_link_for(request))
    return _invitation_out(invitation, _link_for(request)(token))


@router.post("/projects/{project_id}/invitations/{invitation_id}/revoke", response=InvitationOut)
def invitation_revoke(request: HttpRequest, project_id: int, invitation_id: int):
    """Close a pending invitation: its link refuses from now on. A project admin only."""
    return _invitation_out(invitations.invitation_revoke(
        request.user, _invitation(request, project_id, invitation_id)))


@router.get("/events", response=list[EventOut])
def event_list(
    request: HttpRequest,
    after: int = Query(0, ge=0),
    subject_type: str | None = None,
    subject_id: int | None = None,
    limit: int = Query(200, ge=1, le=1000),
):
    """Events after `after` (oldest first) from projects you can see; poll with the last id."""
    subject = None
    if subject_type is not None and subject_id is not None:
        if selectors.subject_accessible_project(request.user, subject_type, subject_id) is None:
            return []
        subject = (subject_type, subject_id)
    return selectors.events_for_user(request.user, after_id=after, subject=subject, limit=limit)


class RepositoryIn(Schema):
    project_id: int
    path: str = Field("", max_length=1000, description="a clone on the server, under CRUCIBLE_REPO_ROOTS")
    url: str = Field("", max_length=1000, description="or a git URL under CRUCIBLE_REPO_URLS, which the "
                     "server clones")
    name: str = Field("", max_length=NAME_MAX_LENGTH)


class RepositoryOut(Schema):
    id: int
    project_id: int
    name: str
    path: str
    remote_url: str
    created_at: datetime


class RefsOut(Schema):
    branches: list[str]
    tags: list[str]
    head: str = Field(description="the checked-out branch, if any")


@router.get("/repositories", response=list[RepositoryOut])
def repository_list(request: HttpRequest):
    return selectors.repositories_for_user(request.user)


@router.post("/repositories", response={201: RepositoryOut})
def repository_register(request: HttpRequest, body: RepositoryIn):
    """Register a git repository under an allowed root (CRUCIBLE_REPO_ROOTS) or clone one from an
    allowed remote (CRUCIBLE_REPO_URLS)."""
    project = selectors.project_for_user(request.user, body.project_id)
    return Status(201, services.repository_register(request.user, project, body.path, body.name,
                                                    url=body.url))


@router.get("/repositories/{repository_id}/refs", response=RefsOut)
def repository_refs(request: HttpRequest, repository_id: int):
    refs = selectors.repository_refs(selectors.repository_for_user(request.user, repository_id))
    if refs["error"]:
        raise ValidationError(refs["error"])
    return refs


@router.get("/receipts/{receipt_id}", response=dict[str, Any])
def receipt_detail(request: HttpRequest, receipt_id: int):
    """Every field of one receipt, as recorded; the same JSON as the page's download link."""
    return selectors.receipt_for_user(request.user, receipt_id).as_dict()


@router.get("/receipts", response=list[dict[str, Any]])
def receipt_list(
    request: HttpRequest, subject_type: str, subject_id: int, limit: int = Query(200, ge=1, le=1000),
):
    """Receipts of one subject (e.g. subject_type=candidate&subject_id=7), oldest first."""
    receipts = selectors.receipts_for_subject(request.user, subject_type, subject_id)[:limit]
    return [receipt.as_dict() for receipt in receipts]
