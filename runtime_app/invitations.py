"""Invitations: a project admin asks an email address no account has to join a project.

The link carries a random token shown once to the inviter (and emailed); only its SHA-256 is
stored, so a leaked database cannot be turned into links. The account and its membership are
made when the invitee sets a password from the link. A resend issues a new token (the old link
stops working), a revoke closes the invitation, and a link expires INVITATION_DAYS after it was
issued. The services here are the only writers of Invitation; the members page, the API and the
invitation page call them. See docs/projects-and-roles.md.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from runtime_app import access
from runtime_app.models import Invitation, Project, ProjectMembership
from runtime_app.records import audit_record, event_emit
from runtime_app.templatetags.crucible_dates import when

INVITATION_DAYS = 7
# Makes the absolute link of a token (the members page and the API build it from their request).
LinkFor = Callable[[str], str]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invitation_is_expired(invitation: Invitation, now: datetime | None = None) -> bool:
    return invitation.expires_at <= (now or timezone.now())


def invitation_status(invitation: Invitation) -> str:
    """pending, expired, accepted or revoked: the word pages and the API show."""
    if invitation.state == Invitation.State.PENDING and invitation_is_expired(invitation):
        return "expired"
    return str(invitation.state)


def invitations_pending(project: Project) -> QuerySet[Invitation]:
    """The project's open invitations (expired ones included, so they can be resent), by email."""
    return project.invitations.filter(state=Invitation.State.PENDING).select_related("invited_by")


def invitation_of(project: Project, invitation_id: int) -> Invitation | None:
    return project.invitations.filter(pk=invitation_id).select_related("invited_by").first()


def invitation_for_token(token: str) -> Invitation | None:
    """The invitation a link's token opens, whatever its state (None: no such link)."""
    if not token or len(token) > 200:
        return None
    return Invitation.objects.filter(token_sha256=_digest(token)).select_related(
        "project", "invited_by", "accepted_by").first()


def invitation_refusal(invitation: Invitation | None) -> str | None:
    """Why a link cannot be used, in a sentence for its holder; None when it can."""
    if invitation is None:
        return ("This invitation link is not valid. It may be mistyped, or it was replaced by a newer "
                "link when the invitation was sent again. Ask a project admin for a new link.")
    project = invitation.project.name
    if invitation.state == Invitation.State.REVOKED:
        return (f"This invitation to {project} was revoked. Ask a project admin of {project} to "
                "invite you again if you still need access.")
    if invitation.state == Invitation.State.ACCEPTED:
        return (f"This invitation to {project} was already used to set a password. Log in with "
                "that account; if you forgot the password, ask a project admin.")
    if invitation_is_expired(invitation):
        return (f"This invitation to {project} expired on {when(invitation.expires_at)}. "
                f"Ask a project admin of {project} to resend it: you will get a new link.")
    return None


def invitation_username(email: str) -> str:
    """The username an invitee's account gets: the address's local part, made unique."""
    users = get_user_model()._default_manager
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", email.split("@")[0])[:100] or "member"
    username, number = base, 1
    while users.filter(username__iexact=username).exists():
        number += 1
        username = f"{base}-{number}"
    return username


def _email_checked(email: str) -> str:
    email = (email or "").strip().lower()
    if not email:
        raise ValidationError({"email": "Give an email address."})
    try:
        validate_email(email)
    except ValidationError:
        raise ValidationError({"email": f"{email!r} is not a valid email address."}) from None
    return email


def _issue(invitation: Invitation) -> str:
    """A fresh token for `invitation` (the previous link stops working) and a new expiry."""
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    invitation.token_sha256 = _digest(token)
    invitation.sent_at = now
    invitation.expires_at = now + timedelta(days=INVITATION_DAYS)
    return token


def _send(actor: User, invitation: Invitation, link: str) -> None:
    project = invitation.project
    send_mail(f"You are invited to {project.name} on Crucible",
              f"{actor.get_username()} invited you to the project {project.name} as "
              f"{access.role_label(invitation.role)}.\n\nSet a password to join (the link works once "
              f"and expires in {INVITATION_DAYS} days):\n{link}\n", None, [invitation.email])


def invitation_create(actor: User, project: Project, email: str, role: str,
                      *, link_for: LinkFor) -> tuple[Invitation, str]:
    """Invite `email` (no account has it) to `project` as `role`; a project admin does this.
    Returns the invitation and its token, which is emailed and must be shown to the inviter once.
    An address with an open invitation gets it renewed (new link, new expiry, the role given)."""
    access.require(actor, access.ADMIN, project)
    if role not in access.ROLE_NAMES:
        raise ValidationError({"role": "Choose one of: " + ", ".join(
            access.role_label(name) for name in access.ROLE_NAMES) + "."})
    email = _email_checked(email)
    if get_user_model()._default_manager.filter(email__iexact=email).exists():
        raise ValidationError({"email": f"An account has the address {email}: add it by username."})
    with transaction.atomic():
        invitation = (Invitation.objects.select_for_update()
                      .filter(project=project, email=email, state=Invitation.State.PENDING).first())
        renewed = invitation is not None
        if invitation is None:
            invitation = Invitation(project=project, email=email, invited_by=actor, sends=0)
        invitation.role = role
        invitation.sends += 1
        token = _issue(invitation)
        invitation.save()
        audit_record(actor, "invitation.resend" if renewed else "invitation.create", project=project,
                     target=email, detail={"email": email, "role": role,
                                           "expires_at": invitation.expires_at.isoformat()})
    _send(actor, invitation, link_for(token))
    return invitation, token


def _open(actor: User, invitation: Invitation) -> Invitation:
    access.require(actor, access.ADMIN, invitation.project)
    locked = Invitation.objects.select_for_update().select_related("project").get(pk=invitation.pk)
    if locked.state != Invitation.State.PENDING:
        raise ValidationError({"invitation": f"The invitation of {locked.email} was "
                                             f"{locked.get_state_display()} already."})
    return locked


def invitation_resend(actor: User, invitation: Invitation, *, link_for: LinkFor) -> tuple[Invitation, str]:
    """Send an open (or expired) invitation again with a new link; the old link stops working."""
    with transaction.atomic():
        invitation = _open(actor, invitation)
        token = _issue(invitation)
        invitation.sends += 1
        invitation.save(update_fields=["token_sha256", "sent_at", "expires_at", "sends"])
        audit_record(actor, "invitation.resend", project=invitation.project, target=invitation.email,
                     detail={"email": invitation.email, "role": invitation.role,
                             "expires_at": invitation.expires_at.isoformat()})
    _send(actor, invitation, link_for(token))
    return invitation, token


def invitation_revoke(actor: User, invitation: Invitation) -> Invitation:
    """Close an open invitation: its link refuses from now on."""
    with transaction.atomic():
        invitation = _open(actor, invitation)
        invitation.state = Invitation.State.REVOKED
        invitation.closed_at = timezone.now()
        invitation.save(update_fields=["state", "closed_at"])
        audit_record(actor, "invitation.revoke", project=invitation.project, target=invitation.email,
                     detail={"email": invitation.email, "role": invitation.role})
    return invitation


def invitation_accept(token: str, password: str) -> User:
    """The invitee sets a password from the link: their account is made and joins the project
    (and every other project with an open invitation for the same address)."""
    users = get_user_model()._default_manager
    with transaction.atomic():
        found = invitation_for_token(token)
        # Only the invitation rows are locked: PostgreSQL refuses FOR UPDATE on the nullable
        # side of the outer join to invited_by.
        locking = Invitation.objects.select_for_update(of=("self",)).select_related("project", "invited_by")
        invitation = locking.filter(pk=found.pk).first() if found else None
        refusal = invitation_refusal(invitation)
        if refusal is not None or invitation is None:
            raise ValidationError(refusal or "This invitation link is not valid.")
        if users.filter(email__iexact=invitation.email).exists():
            raise ValidationError(f"An account has the address {invitation.email} already: log in "
                                  "with it, and ask a project admin to add it by username.")
        candidate = get_user_model()(username=invitation_username(invitation.email), email=invitation.email)
        password_validation.validate_password(password, candidate)
        user: User = users.create_user(username=candidate.get_username(), email=invitation.email,
                                 password=password)
        audit_record(user, "invitation.accept", project=invitation.project, target=invitation.email,
                     detail={"email": invitation.email, "user": user.get_username()})
        now = timezone.now()
        others = locking.filter(email=invitation.email, state=Invitation.State.PENDING, expires_at__gt=now)
        for joined in {invitation.pk: invitation, **{other.pk: other for other in others}}.values():
            _join(user, joined, now)
    return user


def _join(user: User, invitation: Invitation, now: datetime) -> None:
    project, username = invitation.project, user.get_username()
    ProjectMembership.objects.get_or_create(project=project, user=user, defaults={"role": invitation.role})
    invitation.state, invitation.accepted_by, invitation.closed_at = Invitation.State.ACCEPTED, user, now
    invitation.save(update_fields=["state", "accepted_by", "closed_at"])
    inviter = invitation.invited_by.get_username() if invitation.invited_by else "a former member"
    audit_record(user, "project.member_add", project=project, target=username,
                 detail={"user": username, "role": invitation.role, "invited_by": inviter})
    event_emit(project, "project", project.pk, "project.member_added",
               {"message": f"{username} joined as {access.role_label(invitation.role)}"})
