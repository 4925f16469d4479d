"""Every write in runtime_app. Views, API, CLI and tasks all call these."""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from time import monotonic
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from runtime_app import access, remotes, sandbox, signals, tails
from runtime_app.admission import numstat_read, patch_described, tree_judge
from runtime_app.git import GitError, repo_open
from runtime_app.lane import SHARED, lane_hold
from runtime_app.models import (
    ApiToken,
    Event,
    Project,
    ProjectMembership,
    Receipt,
    Repository,
    WorkerHeartbeat,
)
from runtime_app.policy import policy_check
from runtime_app.presenters import NAME_MAX_LENGTH, names_rule
from runtime_app.queue import task_send

# Re-exported: callers write records through services.
from runtime_app.records import EVENT_LOCK_KEY as EVENT_LOCK_KEY
from runtime_app.records import ReceiptBatch as ReceiptBatch
from runtime_app.records import audit_record as audit_record
from runtime_app.records import event_emit as event_emit
from runtime_app.records import event_group as event_group
from runtime_app.records import receipt_record as receipt_record
from runtime_app.worktrees import object_scratch, patch_from_text, patch_stage, tree_checkout

logger = logging.getLogger(__name__)

PROJECT_NAME_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9 ._-]{{0,{NAME_MAX_LENGTH - 1}}}$")
TOKEN_PREFIX = "crc_"  # noqa: S105  (a marker, not a secret)


def project_create(user: User, name: str, description: str = "") -> Project:
    """Create a project; its creator becomes its first project admin."""
    access.require(user, access.CREATE_PROJECT)
    name = (name or "").strip()
    if not PROJECT_NAME_RE.match(name):
        raise ValidationError(
            {"name": f"Use {names_rule()}, starting with a letter or digit."}
        )
    if Project.objects.filter(name__iexact=name).exists():
        raise ValidationError({"name": f"A project named {name!r} already exists."})
    if len(description) > 2000:
        raise ValidationError({"description": "Keep the description under 2,000 characters."})
    with transaction.atomic():
        project = Project.objects.create(name=name, description=description, created_by=user)
        ProjectMembership.objects.create(project=project, user=user, role=access.ADMIN)
        audit_record(user, "project.create", project=project, target=name)
        audit_record(user, "project.member_add", project=project, target=user.get_username(),
                     detail={"user": user.get_username(), "role": access.ADMIN})
        event_emit(project, "project", project.pk, "project.created", {"message": f"{name} created"})
    return project


def _role_checked(role: str) -> str:
    if role not in access.ROLE_NAMES:
        raise ValidationError({"role": "Choose one of: " + ", ".join(
            access.role_label(name) for name in access.ROLE_NAMES) + "."})
    return role


def _admins_left(project: Project, leaving: Any) -> bool:
    """Whether a project admin other than `leaving` remains (a project never loses its last one)."""
    return project.memberships.filter(role=access.ADMIN, user__is_active=True).exclude(user=leaving).exists()


def project_member_add(actor: User, project: Project, user: User,
                       role: str = access.VIEWER) -> ProjectMembership:
    """Make `user` a member of `project` with `role`; a project admin does this (a member already
    there keeps their role: change it with project_member_role_set)."""
    access.require(actor, access.ADMIN, project)
    _role_checked(role)
    if not user.is_active:
        raise ValidationError({"user": f"{user.get_username()}'s account is deactivated."})
    with transaction.atomic():
        membership, created = ProjectMembership.objects.get_or_create(
            project=project, user=user, defaults={"role": role})
        if created:
            audit_record(actor, "project.member_add", project=project, target=user.get_username(),
                         detail={"user": user.get_username(), "role": role})
            event_emit(
                project, "project", project.pk, "project.member_added",
                {"message": f"{user.get_username()} joined as {access.role_label(role)}"},
            )
    return membership


def member_account_find(who: str) -> User | None:
    """The account named `who` (a username, or the email address of an account); None when `who`
    is a valid email address no account has (someone to invite)."""
    who = (who or "").strip()
    if not who:
        raise ValidationError({"who": "Give a username or an email address."})
    users = get_user_model()._default_manager
    user = users.filter(username__iexact=who).first() or (
        users.filter(email__iexact=who).order_by("pk").first() if "@" in who else None)
    if user is not None:
        return user
    if "@" not in who:
        raise ValidationError({"who": f"No account is named {who!r}: give their email address "
                                      "to invite them."})
    try:
        validate_email(who)
    except ValidationError:
        raise ValidationError({"who": f"{who!r} is not a valid email address."}) from None
    return None


def member_find_and_add(actor: User, project: Project, who: str, role: str) -> ProjectMembership:
    """Add the account named `who` (a username or an email address) to `project` with `role`.
    An address no account has is refused here: invite it (runtime_app/invitations.py)."""
    access.require(actor, access.ADMIN, project)
    _role_checked(role)
    user = member_account_find(who)
    if user is None:
        raise ValidationError({"who": f"No account has the address {who.strip()}; invite them from the "
                                      "project's members page (or POST /api/projects/"
                                      f"{project.pk}/invitations)."})
    return project_member_add(actor, project, user, role)


def project_member_role_set(actor: User, project: Project, user: User,
                            role: str) -> ProjectMembership:
    """Change a member's role in `project`; a project admin does this. Dropping below approver
    withdraws their pending decisions (the membership's save hook does it, for every door)."""
    access.require(actor, access.ADMIN, project)
    _role_checked(role)
    membership = project.memberships.filter(user=user).first()
    if membership is None:
        raise ValidationError({"user": f"{user.get_username()} is not a member of {project.name}."})
    if membership.role == role:
        return membership
    if membership.role == access.ADMIN and not _admins_left(project, user):
        raise ValidationError({"role": f"{user.get_username()} is the last project admin of "
                                       f"{project.name}: make someone else admin first."})
    with transaction.atomic(), signals.acting_as(actor):
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def project_member_remove(actor: User, project: Project, user: User) -> None:
    """Take a user off a project; a project admin may do this (and anyone may leave).

    The deletion's hook (project_membership_end) records it and withdraws the user's pending
    decisions on the project's winners, as it does for the admin and any other deletion.
    """
    if actor.pk != user.pk:
        access.require(actor, access.ADMIN, project)
    membership = project.memberships.filter(user=user).first()
    if membership is None:
        raise ValidationError({"user": f"{user.get_username()} is not a member of {project.name}."})
    if membership.role == access.ADMIN and not _admins_left(project, user):
        raise ValidationError({"user": f"{user.get_username()} is the last project admin of "
                                       f"{project.name}: make someone else admin first."})
    with transaction.atomic(), signals.acting_as(actor):
        membership.delete()


def project_membership_end(actor: User | None, membership: ProjectMembership) -> None:
    """What ending a membership does, however it ends (called by its pre_delete hook): audited,
    announced, and the user no longer decides on the project's winners."""
    project, username = membership.project, membership.user.get_username()
    audit_record(actor, "project.member_remove", project=project, target=username,
                 detail={"user": username, "role": membership.role})
    event_emit(project, "project", project.pk, "project.member_removed", {"message": f"{username} left"})
    approver_standing_end(actor, membership.user, project=project,
                          reason=f"{username} was removed from {project.name}")


def project_membership_role_changed(actor: User | None, membership: ProjectMembership,
                                    before: str) -> None:
    """What a role change does, however it is made (called by the membership's save hook):
    audited, announced, and a member dropping below approver no longer decides on winners."""
    project, username = membership.project, membership.user.get_username()
    audit_record(actor, "project.member_role", project=project,
                 target=f"{username}: {before} → {membership.role}",
                 detail={"user": username, "from": before, "to": membership.role})
    event_emit(project, "project", project.pk, "project.member_role",
               {"message": f"{username} is now {access.role_label(membership.role)}"})
    demoted = not access.role_allows(membership.role, access.APPROVER)
    if access.role_allows(before, access.APPROVER) and demoted:
        approver_standing_end(actor, membership.user, project=project,
                              reason=f"{username} is no longer an approver in {project.name}")


def approver_standing_end(actor: User | None, user: User, *, project: Project | None,
                          reason: str) -> None:
    """`user` may no longer decide on the winners of `project` (None: of any project); the apps
    that hold decisions withdraw the pending ones (search_app listens to approver_standing_ended)."""
    signals.approver_standing_ended.send(sender=Project, user=user, project=project, actor=actor,
                                         reason=reason)


def server_path_check(path: str, *, trusted: bool, what: str) -> Any:
    """A path on the server a web user may name: absolute, usable, and under an allowed root
    (CRUCIBLE_REPO_ROOTS) unless `trusted` (the local administrator's CLI)."""
    raw = (path or "").strip()
    if not raw:
        raise ValidationError({"path": f"Give the {what}'s absolute path on the server."})
    try:
        resolved = Path(raw).expanduser().resolve()
    except (RuntimeError, ValueError, OSError) as error:  # `~nobody`, NUL bytes, loops
        raise ValidationError({"path": f"{raw}: not a usable path ({error})."}) from None
    if not trusted:
        roots = settings.CONFIG.repo_roots
        if not roots:
            raise ValidationError({"path": f"No directories are allowed for a {what} yet: an "
                                           "administrator sets CRUCIBLE_REPO_ROOTS."})
        if not any(resolved == root or root in resolved.parents for root in roots):
            allowed = ", ".join(str(root) for root in roots)
            raise ValidationError({"path": f"{resolved} is not under an allowed directory ({allowed})."})
    return resolved


def repository_register(
    user: User, project: Project, path: str = "", name: str = "", *, url: str = "",
    trusted: bool = False,
) -> Repository:
    """Register a git repository for a project: a clone on the web node by `path`, or a remote by
    `url`, which the web node clones (runtime_app.remotes).

    From the web and API a path must lie under an allowed root (CRUCIBLE_REPO_ROOTS) and a URL
    under an allowed remote (CRUCIBLE_REPO_URLS), so a web user cannot point Crucible at arbitrary
    server paths or hosts; `trusted` is for the local administrator's CLI (paths only).
    """
    access.require(user, access.OPERATOR, project)
    if (path or "").strip() and (url or "").strip():
        raise ValidationError({"url": "Give a path on the server or a git URL, not both."})
    if (url or "").strip():
        return _repository_register_remote(user, project, url, name)
    resolved = server_path_check(path, trusted=trusted, what="repository")
    try:
        repo_open(resolved).close()
    except GitError as error:
        raise ValidationError({"path": str(error)}) from None
    name = _repository_name(name or resolved.name)
    existing = Repository.objects.filter(project=project, path=str(resolved)).first()
    if existing:
        return existing
    return _repository_create(user, project, name, str(resolved), "")


def _repository_name(name: str) -> str:
    if not PROJECT_NAME_RE.match(name.strip()):
        raise ValidationError({"name": f"{name.strip()!r} cannot be a repository name. Use {names_rule()}."})
    return name.strip()


def _repository_create(user: User, project: Project, name: str, path: str, url: str) -> Repository:
    if Repository.objects.filter(project=project, name=name).exists():
        raise ValidationError({"name": f"This project already has a repository named {name!r}."})
    with transaction.atomic():
        repository = Repository.objects.create(project=project, name=name, path=path, remote_url=url,
                                               created_by=user)
        audit_record(user, "repository.register", project=project, target=f"{name} {url or path}")
        event_emit(project, "project", project.pk, "repository.registered",
                   {"message": f"repository {name} registered"})
    return repository


def _repository_register_remote(user: User, project: Project, url: str, name: str) -> Repository:
    try:
        url = remotes.remote_url_check(url)
    except remotes.RemoteError as error:
        raise ValidationError({"url": str(error)}) from None
    existing = Repository.objects.filter(project=project, remote_url=url).first()
    if existing:
        return existing
    tail = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    name = _repository_name(name or tail)
    if Repository.objects.filter(project=project, name=name).exists():  # before the clone, not after
        raise ValidationError({"name": f"This project already has a repository named {name!r}."})
    try:
        clone = remotes.remote_clone(url, remotes.clone_path(project.pk, url))
    except remotes.RemoteError as error:
        raise ValidationError({"url": str(error)}) from None
    return _repository_create(user, project, name, str(clone), url)


def repository_fetch(repository: Repository) -> None:
    """Bring a repository registered by URL up to its remote (before a freeze); paths are as they are."""
    if not repository.remote_url:
        return
    try:
        remotes.remote_fetch(repository.remote_url, Path(repository.path))
    except remotes.RemoteError as error:
        raise ValidationError({"repository": str(error)}) from None


def project_ping(user: User, project: Project) -> None:
    """Ask a worker to answer with an event: proves broker, worker and live push work."""
    access.require(user, access.OPERATOR, project)
    with transaction.atomic():
        event = event_emit(
            project, "project", project.pk, "worker.ping",
            {"message": f"{user.get_username()} pinged the workers"},
        )
        transaction.on_commit(lambda: task_send("runtime_app.tasks.project_ping_reply", event.pk))


def project_ping_answer(ping_event_id: int, hostname: str) -> Event | None:
    """The worker's side of project_ping; answering twice changes nothing."""
    ping = Event.objects.filter(pk=ping_event_id, kind="worker.ping").first()
    if ping is None:
        return None
    with transaction.atomic():
        answered = Event.objects.filter(
            project_id=ping.project_id, kind="worker.pong", payload__ping=ping.pk
        ).first()
        if answered:
            return answered
        return event_emit(
            ping.project_id, ping.subject_type, ping.subject_id, "worker.pong",
            {"message": f"worker {hostname} answered", "ping": ping.pk, "hostname": hostname},
        )


def api_token_create(user: User, name: str) -> tuple[ApiToken, str]:
    """Create a personal API token; the plain token is returned once and never stored."""
    name = (name or "").strip()
    if not 1 <= len(name) <= 64:
        raise ValidationError({"name": "Name the token in 1–64 characters, e.g. 'laptop CLI'."})
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=plain[: len(TOKEN_PREFIX) + 6],
            token_sha256=hashlib.sha256(plain.encode()).hexdigest(),
        )
        audit_record(user, "api_token.create", target=f"{name} ({token.prefix}…)")
    return token, plain


def api_token_revoke(user: User, token_id: int) -> ApiToken:
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise ValidationError("No such token.")
    if token.revoked_at is None:
        with transaction.atomic():
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_record(user, "api_token.revoke", target=f"{token.name} ({token.prefix}…)")
    return token


def api_token_authenticate(plain: str) -> User | None:
    """The active user behind a token, or None; marks the token used."""
    if not plain.startswith(TOKEN_PREFIX):
        return None
    digest = hashlib.sha256(plain.encode()).hexdigest()
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_sha256=digest, revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


def worker_heartbeat_record(hostname: str) -> None:
    WorkerHeartbeat.objects.update_or_create(
        hostname=hostname, defaults={"last_seen_at": timezone.now()}
    )


def command_run(
    command: Any, *, project: Project | None = None, subject: tuple[str, int] | None = None,
    label: str = "", note: dict[str, Any] | None = None, pending: ReceiptBatch | None = None,
    **options: Any,
) -> Receipt:
    """Run a command in the sandbox (see runtime_app.sandbox.run) and write its receipt (or add
    it to `pending`, written with its batch); `note` adds what the caller knows to its detail (a
    trial's block and position). A command with a subject has a live tail for the subject's page
    (runtime_app.tails) until its receipt exists."""
    tail = tails.tail_for(subject, label)
    try:
        receipt = sandbox.run(command, tail=tail, **options)
        if note:
            receipt.detail = {**receipt.detail, **note}
        receipt = receipt_record(receipt, project=project, subject=subject, label=label, pending=pending)
        if pending is not None and pending.tails_wait and tail is not None:
            pending.tail_keep(tail)
            tail = None  # closed once the batch is written
        return receipt
    finally:
        if tail is not None:
            tail.close()


def _patch_judge(repo_path: Any, commit: str, patch_text: bytes, name: str, rules: Any,
                 numstat: list[Any], detail: dict[str, Any]) -> Any:
    """patch_admit's stages after the limits: the patched tree in a temporary index, the change
    policy on it, then its checkout; the worktree, or None with the refusal in `detail`."""
    with object_scratch(repo_path) as scratch:
        try:
            tree = patch_stage(repo_path, commit, patch_text, scratch, numstat=numstat)
        except GitError as error:
            detail.update(verdict="rejected", stage="apply", reason=f"patch rejected for {name}: {error}")
            return None
        with closing(scratch.store()) as store:
            verdict = policy_check(store, commit, tree, rules)
        if not verdict.accepted:
            detail.update(verdict="rejected", stage="policy", reason=str(verdict),
                          violations=[{"path": v.path, "reason": v.reason} for v in verdict.violations])
            return None
        try:
            worktree = tree_checkout(repo_path, commit, tree, name, scratch)
        except GitError as error:
            detail.update(verdict="rejected", stage="apply", reason=str(error))
            return None
    detail.update(verdict="admitted", stage="policy")
    return worktree


def patch_admit(
    repo_path: Any, commit: str, patch_text: bytes, name: str, rules: Any, *,
    project: Project | None = None, subject: tuple[str, int] | None = None, label: str = "",
    pending: ReceiptBatch | None = None, plain: bool = False,
) -> tuple[Any, Receipt]:
    """Judge a candidate's patch by the change policy and check it out in a fresh baseline worktree.

    Returns (worktree path, receipt) when admitted, (None, receipt) when the patch is over the
    rules' patch limits (judged before it is applied), does not apply cleanly or breaks a rule;
    a refused patch leaves no worktree. The patched tree is built once in a temporary index
    (its objects in a scratch directory), judged from there, and only an admitted one is checked
    out. The receipt says which stage refused it and why, path by path. Nothing the patch
    brings is written into the repository's object store.

    `plain=True` (evaluation, trial, replay and review trees): a plain directory instead of a
    worktree (worktrees.tree_apply; no `.git`, no repository lock), judged by the change policy
    on what it holds before anything runs there (runtime_app/admission.py).
    """
    # Its git calls and tree reads are one piece of work on this host: no trial runs beside it.
    with lane_hold(SHARED):
        started_at, started = datetime.now(UTC), monotonic()
        limits = rules.limits
        detail: dict[str, Any] = {"patch_sha256": hashlib.sha256(patch_text).hexdigest(), "baseline": commit}
        worktree = None
        # Over the byte limit, the text is not even read for its numstat.
        refusal = limits.text_refusal(len(patch_text))
        if refusal is None:
            # Its numstat is handed on: read in this process, or else by `git apply --numstat` once
            # (a wrong reading only refuses: the applied tree is checked against it).
            read = numstat_read(patch_text)
            patch = patch_described(patch_text, read) if read is not None else patch_from_text(patch_text)
            detail.update(diff_lines=patch.diff_lines, files=patch.files[:200])
            refusal = limits.files_refusal(len(patch.files))
        if refusal is not None:
            detail.update(verdict="rejected", stage="policy", reason=refusal)
        elif plain:
            worktree = tree_judge(repo_path, commit, patch_text, name, rules, patch.numstat, detail)
        else:
            worktree = _patch_judge(repo_path, commit, patch_text, name, rules, patch.numstat, detail)
        receipt = Receipt(
            kind=Receipt.Kind.APPLY, argv=["git", "apply", "--cached"], cwd=".",
            started_at=started_at, finished_at=datetime.now(UTC),
            duration_seconds=round(monotonic() - started, 6),
            exit_code=0 if worktree is not None else 1, detail=detail,
        )
    return worktree, receipt_record(receipt, project=project, subject=subject, label=label, pending=pending)
