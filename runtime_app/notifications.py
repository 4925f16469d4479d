"""Notifications: per-user email settings, per-project outgoing webhooks, and their delivery.

The services here (`notification_send`, `webhook_create`, `webhook_delivery_attempt` …) are
the only writers of NotificationSetting, Webhook and WebhookDelivery; views, tasks and the
apps that decide who hears about what (search_app/notifications.py) call them.

A webhook's shared secret is stored encrypted (Fernet, keyed from Django's secret key, as
runtime_app/keys.py does for provider keys), is shown once when Crucible generates it and
never again, and never enters a payload, an event, a receipt, a log line or a task argument.
See docs/notifications.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import secrets
import socket
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import SplitResult, urlsplit

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runtime_app import access
from runtime_app.models import NotificationSetting, Project, Receipt, Webhook, WebhookDelivery
from runtime_app.queue import task_send
from runtime_app.records import audit_record, receipt_record
from runtime_app.subjects import subject_label_register

logger = logging.getLogger(__name__)

# What a person can turn on or off (NotificationSetting's fields), in the order pages show them.
TOPICS = ("approval_waiting", "search_done", "replies")
MAX_ATTEMPTS = 5
# Waits before attempts 2 … 5, in CRUCIBLE_WEBHOOK_RETRY_SECONDS (30 s: 30 s, 2 min, 10 min, 1 h).
BACKOFF_FACTORS = (1, 4, 20, 120)
TIMEOUT_SECONDS = 10
# A claimed attempt is due again after this if its worker died before recording it.
CLAIM_SECONDS = 3 * TIMEOUT_SECONDS
EXCERPT_CHARS = 1000
SIGNATURE_HEADER = "X-Crucible-Signature"
TIMESTAMP_HEADER = "X-Crucible-Timestamp"
RECEIPT_SUBJECT = "webhook_delivery"


def _delivery_labels(ids: list[int]) -> dict[int, str]:
    return {pk: f"delivery #{pk} to {name}" for pk, name in
            WebhookDelivery.objects.filter(pk__in=ids).values_list("pk", "webhook__name")}


subject_label_register(RECEIPT_SUBJECT, _delivery_labels)


# ------------------------------------------------------------------------------------ settings


def notification_setting_for(user: AbstractUser) -> NotificationSetting:
    """The user's settings; unsaved defaults (everything on) when they never changed them."""
    found = NotificationSetting.objects.filter(user=user).first()
    return found or NotificationSetting(user=user)


def notification_setting_update(
    user: AbstractUser, *, email_address: str, email: bool, approval_waiting: bool, search_done: bool,
    replies: bool,
) -> NotificationSetting:
    """Save what the user wants to hear about and the address emails go to."""
    email_address = (email_address or "").strip()
    if email_address:
        try:
            validate_email(email_address)
        except ValidationError:
            raise ValidationError({"email_address": f"{email_address!r} is not an email address."}) from None
    elif email:
        raise ValidationError({"email_address": "Give an email address, or turn email off."})
    chosen = {"email": email, "approval_waiting": approval_waiting, "search_done": search_done,
              "replies": replies}
    with transaction.atomic():
        setting, _ = NotificationSetting.objects.update_or_create(user=user, defaults=chosen)
        if user.email != email_address:
            user.email = email_address
            user.save(update_fields=["email"])
        audit_record(user, "notification.settings", target=user.get_username(), detail=chosen)
    return setting


def _wants(user: AbstractUser, topic: str, settings_by_user: dict[int, NotificationSetting]) -> bool:
    setting = settings_by_user.get(user.pk) or NotificationSetting(user=user)
    return setting.email and getattr(setting, topic)


# ------------------------------------------------------------------------------------ sending


def notification_send(project: Project | int, topic: str, recipients: Any, subject: str, text: str, url: str,
                      *, actor: AbstractUser | None = None, event_kind: str = "",
                      webhooks: bool = True) -> dict[str, Any]:
    """Tell `recipients` (by email, where their settings allow and they have an address) and the
    project's active webhooks (unless `webhooks` is False: another call tells them of the same
    thing) that something happened. `actor`, who did it, is never told of their own action.
    Call it once the change has committed; webhook deliveries are handed to the workers on commit.
    Returns {"emailed": [usernames], "deliveries": [ids]}."""
    if topic not in TOPICS:
        raise ValueError(f"unknown notification topic {topic!r}")
    project = project if isinstance(project, Project) else Project.objects.get(pk=project)
    people = {user.pk: user for user in recipients if user is not None and user.is_active}
    if actor is not None:
        people.pop(getattr(actor, "pk", None), None)
    settings_by_user = {s.user_id: s for s in NotificationSetting.objects.filter(user_id__in=list(people))}
    emailed = []
    for user in people.values():
        if not user.email or not _wants(user, topic, settings_by_user):
            continue
        try:
            send_mail(f"[Crucible] {subject}", f"{text}\n\n{url}\n\n— Crucible, project {project.name}. "
                      "Change what you hear about on your account page.", None, [user.email])
        except Exception as error:  # a mail server's trouble must not undo or stop the change
            logger.warning("could not email %s about %s: %s", user.get_username(), topic, error)
        else:
            emailed.append(user.get_username())
    deliveries = []
    if webhooks:
        deliveries = _deliveries_create(project, topic, subject, text, url, event_kind or topic)
    return {"emailed": sorted(emailed), "deliveries": [d.pk for d in deliveries]}


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webhook_payload(project: Project, topic: str, subject: str, text: str, url: str, kind: str) -> dict:
    """The JSON a webhook receives: Slack's `text` and `blocks`, plus Crucible's own fields."""
    link = f"<{url}|{_slack_escape(subject)}>" if url else _slack_escape(subject)
    return {
        "text": f"{subject}: {url}" if url else subject,
        "blocks": [{"type": "section",
                    "text": {"type": "mrkdwn", "text": f"*{link}*\n{_slack_escape(text)}"}}],
        "crucible": {"topic": topic, "kind": kind, "project": project.name, "project_id": project.pk,
                     "subject": subject, "text": text, "url": url},
    }


def _deliveries_create(project: Project, topic: str, subject: str, text: str, url: str,
                       kind: str) -> list[WebhookDelivery]:
    payload = webhook_payload(project, topic, subject, text, url, kind)
    now = timezone.now()
    with transaction.atomic():
        deliveries = [WebhookDelivery.objects.create(webhook=webhook, kind=kind, payload=payload,
                                                     next_attempt_at=now)
                      for webhook in project.webhooks.filter(active=True)]
        for delivery in deliveries:
            transaction.on_commit(lambda pk=delivery.pk: _enqueue(pk))
    return deliveries


def _enqueue(delivery_id: int, countdown: float = 0) -> None:
    try:
        task_send("runtime_app.tasks.webhook_deliver", delivery_id, countdown=countdown or None)
    except Exception:  # the reconciler sends it once it is due
        logger.warning("could not enqueue webhook delivery %s", delivery_id, exc_info=True)


# ------------------------------------------------------------------------------ webhook secrets


def _fernet():
    digest = hashlib.sha256(b"crucible webhook secrets\0" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _secret_of(webhook: Webhook) -> str | None:
    try:
        return _fernet().decrypt(webhook.secret_ciphertext.encode()).decode()
    except InvalidToken:
        return None  # the secret key changed since: an administrator adds the webhook again


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=` and the hex HMAC-SHA256, keyed with the shared secret, of `<timestamp>.<body>`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


# ------------------------------------------------------------------------------ URL checks (SSRF)


class WebhookRefused(ValidationError):
    """A webhook URL Crucible will not send to; the message names the reason."""


class WebhookUnresolved(WebhookRefused):
    """The host name does not resolve now (which may pass: a delivery retries)."""


def _resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (tests replace this to play DNS)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def _own_names() -> set[str]:
    """Names this server answers to: its host name and the non-loopback names it serves."""
    names = {socket.gethostname().lower()}
    for host in settings.ALLOWED_HOSTS:
        host = host.lower().lstrip(".")
        if host and host != "*" and not _is_literal(host) and not _loopback_name(host):
            names.add(host)
    if settings.CONFIG.host not in ("0.0.0.0", "::", "") and not _is_literal(settings.CONFIG.host):  # noqa: S104
        names.add(settings.CONFIG.host.lower())
    return names


def _own_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    found = set()
    for name in _own_names():
        try:
            found.update(_address(a) for a in _resolve(name, 80))
        except OSError:
            continue
    if _is_literal(settings.CONFIG.host):
        found.add(_address(settings.CONFIG.host))
    return found


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    return True


def _loopback_name(host: str) -> bool:
    host = host.lower().rstrip(".")
    return host == "localhost" or host.endswith(".localhost")


def _address(raw: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(raw.split("%")[0])
    if address.version == 6 and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _address_refusal(address: ipaddress.IPv4Address | ipaddress.IPv6Address, own: set) -> str:
    allow_loopback = settings.CONFIG.webhook_allow_loopback
    if address.is_unspecified or (address.version == 4 and address in ipaddress.ip_network("0.0.0.0/8")):
        return "an unspecified address (it reaches this machine)"
    if address.is_loopback:
        return "" if allow_loopback else ("a loopback address (this machine); an administrator can allow "
                                          "loopback with CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK=true")
    if address.is_link_local:
        return "a link-local address (such as a cloud's metadata service at 169.254.169.254)"
    if address.is_multicast:
        return "a multicast address"
    if address.version == 4 and address == ipaddress.ip_address("255.255.255.255"):
        return "the broadcast address"
    if address in own:
        return "this server's own address"
    return ""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL and the address to connect to (the one that was checked)."""

    parts: SplitResult
    host: str
    port: int
    address: str


def webhook_url_check(url: str) -> Target:
    """The URL's target if Crucible may send to it, else WebhookRefused naming why: http or
    https with a host, no credentials, and no resolved address that is loopback (unless
    allowed), link-local, unspecified, multicast or this server's own. Called when a webhook is
    added and again before every attempt, since DNS can change."""
    raw = (url or "").strip()
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as error:
        raise WebhookRefused(f"{raw!r} is not a usable URL ({error}).") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        named = f"a {scheme}: URL" if scheme else "a URL without a scheme"
        raise WebhookRefused(f"A webhook URL must start with http:// or https://; this is {named}.")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookRefused("The URL names no host.")
    if parts.username or parts.password:
        raise WebhookRefused("Put no user name or password in the URL; the shared secret signs each "
                             "delivery.")
    if len(raw) > 2000:
        raise WebhookRefused("Keep the URL under 2,000 characters.")
    port = port or (443 if scheme == "https" else 80)
    if _loopback_name(host) and not settings.CONFIG.webhook_allow_loopback:
        raise WebhookRefused(f"{host} is this machine (loopback); an administrator can allow loopback "
                             "with CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK=true.")
    if host.lower() in _own_names():
        raise WebhookRefused(f"{host} is this server's own name: a webhook may not point at the server "
                             "itself.")
    try:
        resolved = _resolve(host, port)
    except (OSError, UnicodeError) as error:
        raise WebhookUnresolved(f"{host} does not resolve ({error}).") from None
    if not resolved:
        raise WebhookUnresolved(f"{host} does not resolve.")
    own = _own_addresses()
    for raw_address in resolved:
        reason = _address_refusal(_address(raw_address), own)
        if reason:
            shown = host if _is_literal(host) else f"{host} resolves to {raw_address}, which"
            raise WebhookRefused(f"{shown} is {reason}: webhooks may not point there.")
    return Target(parts, host, port, resolved[0])


# ------------------------------------------------------------------------------ webhooks (admin)


def _require_project_admin(user: AbstractUser, project: Project) -> None:
    """Who may manage a project's webhooks: its project admins (and superusers)."""
    access.require(user, access.ADMIN, project)


def project_admin_is(user: AbstractUser, project: Project) -> bool:
    try:
        _require_project_admin(user, project)
    except PermissionDenied:
        return False
    return True


def webhook_create(user: AbstractUser, project: Project, name: str, url: str,
                   secret: str = "") -> tuple[Webhook, str]:
    """Add a webhook; with no secret given Crucible makes one. Returns the webhook and the
    secret to show once if Crucible made it (else ""): it is never shown again."""
    _require_project_admin(user, project)
    name, secret = (name or "").strip(), (secret or "").strip()
    errors = {}
    if not 1 <= len(name) <= 64:
        errors["name"] = "Name the webhook in 1–64 characters, e.g. 'team Slack'."
    elif project.webhooks.filter(name__iexact=name).exists():
        errors["name"] = f"This project already has a webhook named {name!r}."
    generated = ""
    if not secret:
        secret = generated = secrets.token_urlsafe(32)
    elif len(secret) < 16 or len(secret) > 200 or any(c.isspace() for c in secret):
        errors["secret"] = "Use 16–200 characters without spaces, or leave it empty for Crucible to make one."  # noqa: S105
    try:
        webhook_url_check(url)
    except WebhookRefused as refused:
        errors["url"] = refused.messages[0]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        webhook = Webhook.objects.create(project=project, name=name, url=url.strip(), created_by=user,
                                         secret_ciphertext=_fernet().encrypt(secret.encode()).decode())
        audit_record(user, "webhook.create", project=project, target=f"{name} {webhook.url_shown}")
    return webhook, generated


def webhook_deactivate(user: AbstractUser, webhook: Webhook) -> Webhook:
    """Stop sending to a webhook; its pending deliveries fail at their next attempt."""
    _require_project_admin(user, webhook.project)
    if webhook.active:
        with transaction.atomic():
            webhook.active = False
            webhook.save(update_fields=["active"])
            audit_record(user, "webhook.deactivate", project=webhook.project,
                         target=f"{webhook.name} {webhook.url_shown}")
    return webhook


def webhook_delete(user: AbstractUser, webhook: Webhook) -> None:
    """Remove a webhook and its deliveries (their receipts stay)."""
    _require_project_admin(user, webhook.project)
    with transaction.atomic():
        audit_record(user, "webhook.delete", project=webhook.project,
                     target=f"{webhook.name} {webhook.url_shown}")
        webhook.delete()


# ------------------------------------------------------------------------------ delivery


def webhook_deliveries_due(limit: int = 200) -> list[int]:
    """Deliveries whose attempt is due: new, retrying, or claimed by a worker that died."""
    now = timezone.now()
    due = WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING).filter(
        Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True))
    return list(due.order_by("next_attempt_at", "id").values_list("pk", flat=True)[:limit])


def _claim(delivery_id: int) -> bool:
    """Take the delivery's next attempt (compare-and-set): one worker at a time, and a claim
    that is never recorded lapses after CLAIM_SECONDS."""
    now = timezone.now()
    return bool(WebhookDelivery.objects.filter(pk=delivery_id, state=WebhookDelivery.State.PENDING).filter(
        Q(next_attempt_at__lte=now) | Q(next_attempt_at__isnull=True)
    ).update(next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS)))


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to the checked address, with the URL's host for SNI and certificate checks."""

    def __init__(self, host: str, port: int, address: str, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _post(target: Target, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, int]:
    """POST to the checked address (never re-resolved), no redirects followed. Returns the
    status, the start of the response body and its length so far."""
    parts = target.parts
    default_port = 443 if parts.scheme.lower() == "https" else 80
    host = f"[{target.host}]" if ":" in target.host else target.host
    headers = {**headers, "Host": host if target.port == default_port else f"{host}:{target.port}"}
    if parts.scheme.lower() == "https":
        connection: http.client.HTTPConnection = _PinnedHTTPSConnection(
            target.host, target.port, target.address, timeout=TIMEOUT_SECONDS,
            context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(target.address, target.port, timeout=TIMEOUT_SECONDS)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        content = response.read(EXCERPT_CHARS * 4)
        return response.status, content, len(content)
    finally:
        connection.close()


def _retry_delay(attempt: int) -> float:
    return settings.CONFIG.webhook_retry_seconds * BACKOFF_FACTORS[min(attempt, len(BACKOFF_FACTORS)) - 1]


def webhook_delivery_attempt(delivery_id: int) -> WebhookDelivery | None:
    """Make the delivery's next attempt if it is due (the task's body; running it twice at once
    sends once). Signs `<timestamp>.<body>`, POSTs to the address checked just now, writes a
    receipt, and schedules a retry with backoff on a network error, a 5xx or a 429, up to
    MAX_ATTEMPTS. Returns the delivery, or None when nothing was due."""
    if not _claim(delivery_id):
        return None
    delivery = WebhookDelivery.objects.select_related("webhook__project").filter(pk=delivery_id).first()
    if delivery is None:  # its webhook was deleted meanwhile
        return None
    webhook = delivery.webhook
    attempt = delivery.attempts + 1
    secret = _secret_of(webhook)
    body = json.dumps(delivery.payload, ensure_ascii=False, separators=(",", ":")).encode()
    started_at, started = datetime.now(UTC), time.monotonic()
    status = None
    excerpt, length, address, error = b"", 0, "", ""
    retry = False
    if not webhook.active:
        error = "the webhook was deactivated"
    elif secret is None:
        error = "its secret cannot be read since the server's secret key changed: add the webhook again"
    else:
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "User-Agent": "Crucible-Webhook/1",
                   TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(secret, timestamp, body),
                   "X-Crucible-Delivery": str(delivery.pk), "X-Crucible-Event": delivery.kind}
        try:
            target = webhook_url_check(webhook.url)
            address = target.address
            status, excerpt, length = _post(target, body, headers)
        except WebhookUnresolved as refused:
            error, retry = refused.messages[0], True
        except WebhookRefused as refused:
            error = f"refused: {refused.messages[0]}"
        except (OSError, http.client.HTTPException) as failure:
            error = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
            retry = True
        else:
            retry = status == 429 or status >= 500
    delivered = status is not None and 200 <= status < 300
    if not delivered and not error:
        error = f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
    retry = retry and attempt < MAX_ATTEMPTS
    delay = _retry_delay(attempt) if retry else 0.0
    text = excerpt.decode(errors="replace")[:EXCERPT_CHARS]
    if secret:
        text, error = text.replace(secret, "[secret]"), error.replace(secret, "[secret]")
    if delivered:
        verdict = f"delivered (HTTP {status})"
    elif retry:
        verdict = f"{error}; retrying in {delay:g} s"
    else:
        verdict = f"{error}; gave up" if attempt >= MAX_ATTEMPTS else error
    receipt = Receipt(
        kind=Receipt.Kind.WEBHOOK, argv=["POST", webhook.url_shown], started_at=started_at,
        finished_at=datetime.now(UTC),
        duration_seconds=round(time.monotonic() - started, 6),
        exit_code=0 if delivered else (1 if status is not None else None),
        error="" if status is not None else error,
        stdout_excerpt=text, stdout_bytes=length,
        detail={"verdict": verdict, "attempt": attempt, "max_attempts": MAX_ATTEMPTS, "status": status,
                "address": address, "webhook": webhook.name, "event": delivery.kind, "delivery": delivery.pk},
    )
    with transaction.atomic():
        receipt_record(receipt, project=webhook.project, subject=(RECEIPT_SUBJECT, delivery.pk),
                       label=f"webhook {webhook.name} attempt {attempt}")
        delivery.attempts = attempt
        delivery.last_status_code = status
        delivery.last_error = "" if delivered else error[:2000]
        if delivered:
            delivery.state, delivery.next_attempt_at = WebhookDelivery.State.DELIVERED, None
        elif retry:
            delivery.next_attempt_at = timezone.now() + timedelta(seconds=delay)
        else:
            delivery.state, delivery.next_attempt_at = WebhookDelivery.State.FAILED, None
        delivery.save(update_fields=["attempts", "last_status_code", "last_error", "state", "next_attempt_at",
                                     "updated_at"])
        if retry:
            transaction.on_commit(lambda: _enqueue(delivery.pk, countdown=delay))
    return delivery
