"""Notifications: emails by each person's settings, project webhooks signed with a shared secret,
retried with backoff against a real loopback receiver, a receipt per attempt, SSRF refused."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app import notifications
from runtime_app.models import NotificationSetting, Receipt, Webhook, WebhookDelivery
from runtime_app.notifications import (
    WebhookRefused,
    notification_send,
    notification_setting_update,
    webhook_create,
    webhook_deactivate,
    webhook_deliveries_due,
    webhook_delivery_attempt,
    webhook_url_check,
)
from tests.helpers import login, make_user, text_of

SECRET = "s3cret-shared-with-the-receiver"


@pytest.fixture
def config(settings):
    def change(**values):
        settings.CONFIG = dataclasses.replace(settings.CONFIG, **values)
    return change


@pytest.fixture
def loopback(config):
    """Loopback allowed (single machine, tests) and retries due at once."""
    config(webhook_allow_loopback=True, webhook_retry_seconds=0)


class Receiver:
    """A real HTTP server on 127.0.0.1 that checks each delivery's signature and answers with
    the next status of `answers` (the last one repeats)."""

    def __init__(self, answers: list[int], secret: str = SECRET) -> None:
        self.answers, self.secret = list(answers), secret
        self.requests: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                timestamp = self.headers["X-Crucible-Timestamp"]
                expected = "sha256=" + hmac.new(receiver.secret.encode(), timestamp.encode() + b"." + body,
                                                hashlib.sha256).hexdigest()
                valid = hmac.compare_digest(expected, self.headers["X-Crucible-Signature"])
                receiver.requests.append({"body": body, "headers": dict(self.headers), "valid": valid,
                                          "path": self.path})
                status = receiver.answers.pop(0) if len(receiver.answers) > 1 else receiver.answers[0]
                status = status if valid else 401
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"try again")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/team?channel=crucible"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def deliver_until_settled(delivery: WebhookDelivery, deadline_seconds: float = 60) -> WebhookDelivery:
    """Run due attempts as the workers would, until the delivery is delivered or failed."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        if delivery.pk in webhook_deliveries_due():
            webhook_delivery_attempt(delivery.pk)
        delivery.refresh_from_db()
        if delivery.state != WebhookDelivery.State.PENDING:
            return delivery
        time.sleep(0.05)
    raise AssertionError(f"delivery {delivery.pk} did not settle: {delivery.state}, {delivery.last_error}")


def send(project, **extra):
    return notification_send(project, "search_done", extra.pop("recipients", []), "search-1 finished",
                             "winner cand_002 <b>awaiting</b> approval", "https://crucible.example/searches/s1/",
                             event_kind="search.finished", **extra)


# ---------------------------------------------------------------------------------------- email


def test_people_are_emailed_by_default_when_they_have_an_address(personas):
    personas.member.email = "member@example.com"
    personas.member.save()
    result = send(personas.alpha, recipients=[personas.member, personas.owner])
    assert result["emailed"] == ["member"]  # the owner has no address
    assert [m.to for m in mail.outbox] == [["member@example.com"]]
    assert "search-1 finished" in mail.outbox[0].subject
    assert "https://crucible.example/searches/s1/" in mail.outbox[0].body


def test_a_person_who_turned_a_topic_or_email_off_is_not_emailed(personas):
    notification_setting_update(personas.member, email_address="member@example.com", email=True,
                                approval_waiting=True, search_done=False, replies=True)
    notification_setting_update(personas.owner, email_address="owner@example.com", email=False,
                                approval_waiting=True, search_done=True, replies=True)
    assert send(personas.alpha, recipients=[personas.member, personas.owner])["emailed"] == []
    assert mail.outbox == []
    notification_send(personas.alpha, "replies", [personas.member], "a reply", "text", "")
    assert [m.to for m in mail.outbox] == [["member@example.com"]]


def test_the_actor_is_never_told_of_their_own_action(personas):
    notification_setting_update(personas.member, email_address="member@example.com", email=True,
                                approval_waiting=True, search_done=True, replies=True)
    assert send(personas.alpha, recipients=[personas.member], actor=personas.member)["emailed"] == []
    assert mail.outbox == []


def test_settings_need_a_valid_address_when_email_is_on(personas):
    with pytest.raises(ValidationError, match="not an email address"):
        notification_setting_update(personas.member, email_address="nope", email=True,
                                    approval_waiting=True, search_done=True, replies=True)
    with pytest.raises(ValidationError, match="Give an email address"):
        notification_setting_update(personas.member, email_address="", email=True,
                                    approval_waiting=True, search_done=True, replies=True)
    assert not NotificationSetting.objects.exists()


# ---------------------------------------------------------------------------------------- webhooks


@pytest.mark.django_db(transaction=True)
def test_a_delivery_answered_500_is_retried_and_ends_delivered_with_two_receipts(personas, loopback):
    with Receiver([500, 200]) as receiver:
        webhook_create(personas.owner, personas.alpha, "team", receiver.url, SECRET)
        delivery = WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0])
        delivery = deliver_until_settled(delivery)
    assert delivery.state == "delivered" and delivery.attempts == 2 and delivery.last_status_code == 200
    assert [r["valid"] for r in receiver.requests] == [True, True]
    assert receiver.requests[0]["path"] == "/hooks/team?channel=crucible"
    payload = json.loads(receiver.requests[1]["body"])
    assert payload["text"].startswith("search-1 finished")
    assert payload["crucible"]["kind"] == "search.finished" and payload["crucible"]["project"] == "alpha"
    assert "&lt;b&gt;awaiting" in payload["blocks"][0]["text"]["text"]  # Slack's escaping
    receipts = Receipt.objects.filter(subject_type="webhook_delivery", subject_id=delivery.pk)
    assert [(r.kind, r.detail["attempt"], r.detail["status"]) for r in receipts] == [
        ("webhook", 1, 500), ("webhook", 2, 200)]
    assert "retrying" in receipts[0].outcome and receipts[1].succeeded
    assert receipts[0].argv == ["POST", f"http://127.0.0.1:{receiver.server.server_address[1]}/…"]

    page = text_of(login(personas.member).get(f"/receipts/{receipts[0].pk}/"))
    assert f"delivery #{delivery.pk} to team" in page and "retrying" in page
    assert login(personas.outsider).get(f"/receipts/{receipts[0].pk}/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_secret_is_in_no_payload_receipt_event_audit_entry_or_page(personas, loopback):
    from runtime_app.models import AuditEntry, Event

    with Receiver([200]) as receiver:
        webhook, shown = webhook_create(personas.owner, personas.alpha, "team", receiver.url, SECRET)
        assert shown == ""  # the admin chose it: nothing to show
        deliver_until_settled(WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0]))
    assert SECRET not in webhook.secret_ciphertext
    assert all(SECRET.encode() not in r["body"] and SECRET not in json.dumps(r["headers"])
               for r in receiver.requests)
    stored = [*WebhookDelivery.objects.values_list("payload", "last_error"),
              *Receipt.objects.values_list("argv", "detail", "stdout_excerpt", "error"),
              *Event.objects.values_list("payload"), *AuditEntry.objects.values_list("target", "detail")]
    assert SECRET not in json.dumps(stored, default=str)
    page = login(personas.owner).get(f"/projects/{personas.alpha.pk}/webhooks/").content.decode()
    assert "team" in page and SECRET not in page


@pytest.mark.django_db(transaction=True)
def test_a_wrong_secret_is_refused_by_the_receiver_and_not_retried(personas, loopback):
    with Receiver([200], secret="the-receiver-expects-another") as receiver:
        webhook_create(personas.owner, personas.alpha, "team", receiver.url, SECRET)
        delivery = WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0])
        delivery = deliver_until_settled(delivery)
    assert delivery.state == "failed" and delivery.attempts == 1 and delivery.last_status_code == 401


def test_a_failing_delivery_backs_off_then_gives_up_after_five_attempts(personas, config):
    config(webhook_allow_loopback=True, webhook_retry_seconds=30)
    with Receiver([503]) as receiver:
        webhook_create(personas.owner, personas.alpha, "team", receiver.url, SECRET)
        delivery = WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0])
        webhook_delivery_attempt(delivery.pk)
        delivery.refresh_from_db()
        assert delivery.state == "pending" and delivery.attempts == 1
        assert delivery.pk not in webhook_deliveries_due()  # its retry waits
        assert webhook_delivery_attempt(delivery.pk) is None  # and nothing is sent before it is due
        config(webhook_allow_loopback=True, webhook_retry_seconds=0)
        delivery = deliver_until_settled(delivery)
    assert delivery.state == "failed" and delivery.attempts == notifications.MAX_ATTEMPTS
    assert len(receiver.requests) == notifications.MAX_ATTEMPTS
    assert "gave up" in Receipt.objects.filter(subject_type="webhook_delivery").last().outcome


def test_a_claimed_attempt_whose_worker_died_is_due_again_after_its_claim(personas, loopback):
    from datetime import timedelta

    from django.utils import timezone

    with Receiver([200]) as receiver:
        webhook_create(personas.owner, personas.alpha, "team", receiver.url, SECRET)
        delivery = WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0])
        assert notifications._claim(delivery.pk)  # a worker took it, then died
        assert delivery.pk not in webhook_deliveries_due()
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            next_attempt_at=timezone.now() - timedelta(seconds=1))  # its claim lapsed
        assert deliver_until_settled(delivery).state == "delivered"


def test_the_reconciler_hands_due_deliveries_to_the_workers(personas, loopback, monkeypatch):
    from runtime_app import tasks

    webhook_create(personas.owner, personas.alpha, "team", "http://127.0.0.1:9/hook", SECRET)
    due = send(personas.alpha)["deliveries"]
    sent = []
    monkeypatch.setattr(tasks.webhook_deliver, "delay", sent.append)
    tasks.webhook_deliveries_reconcile()
    assert sent == due


def test_deliveries_are_handed_to_the_workers_on_commit(personas, loopback,
                                                        django_capture_on_commit_callbacks):
    webhook_create(personas.owner, personas.alpha, "team", "http://127.0.0.1:9/hook", SECRET)
    with django_capture_on_commit_callbacks() as callbacks:
        send(personas.alpha)
    assert len(callbacks) == 1


def test_an_inactive_webhook_gets_no_new_deliveries_and_its_pending_ones_fail(personas, loopback):
    webhook, _ = webhook_create(personas.owner, personas.alpha, "team", "http://127.0.0.1:9/hook", SECRET)
    delivery = WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0])
    webhook_deactivate(personas.owner, webhook)
    assert send(personas.alpha)["deliveries"] == []
    webhook_delivery_attempt(delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state == "failed" and "deactivated" in delivery.last_error


def test_crucible_makes_a_secret_when_none_is_given_and_shows_it_once(personas, loopback):
    webhook, shown = webhook_create(personas.owner, personas.alpha, "team", "http://127.0.0.1:9/hook")
    assert len(shown) >= 32 and notifications._secret_of(webhook) == shown


def test_only_project_admins_manage_webhooks(personas, loopback):
    viewer = make_user("viewer-only")
    personas.alpha.memberships.create(user=viewer)
    # a viewer, an operator of the project, a project admin of another project, an outsider
    for user, project in [(viewer, personas.alpha), (personas.member, personas.alpha),
                          (personas.outsider, personas.alpha), (personas.member, personas.beta)]:
        with pytest.raises(PermissionDenied):
            webhook_create(user, project, "team", "http://127.0.0.1:9/hook", SECRET)
    assert not Webhook.objects.exists()


# ---------------------------------------------------------------------------------------- SSRF


def fake_dns(monkeypatch, answers: dict[str, list[str]]) -> dict[str, list[str]]:
    """Names in `answers` resolve to their addresses (change them to play a DNS change); other
    names (this machine's own) resolve as they do."""
    real = notifications._resolve
    monkeypatch.setattr(notifications, "_resolve",
                        lambda host, port: answers[host] if host in answers else real(host, port))
    return answers


@pytest.mark.parametrize(("url", "reason"), [
    ("ftp://hooks.example.com/x", "must start with http:// or https://"),
    ("javascript:alert(1)", "must start with http:// or https://"),
    ("hooks.example.com/x", "without a scheme"),
    ("http:///nohost", "names no host"),
    ("http://user:pw@hooks.example.com/", "no user name or password"),
    ("http://127.0.0.1:8000/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://2130706433/", "loopback"),  # 127.0.0.1 as a number
    ("http://localhost/", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
])
def test_a_webhook_url_that_is_not_http_or_points_at_this_machine_is_refused(personas, url, reason):
    with pytest.raises(ValidationError) as refused:
        webhook_create(personas.owner, personas.alpha, "team", url, SECRET)
    assert reason in refused.value.message_dict["url"][0]
    assert not Webhook.objects.exists()


def test_a_name_that_resolves_to_loopback_is_refused(personas, monkeypatch):
    fake_dns(monkeypatch, {"hooks.example.com": ["93.184.215.14", "127.0.0.1"]})
    with pytest.raises(WebhookRefused, match=r"example\.com resolves to 127\.0\.0\.1, which is a loopback"):
        webhook_url_check("https://hooks.example.com/x")


def test_the_servers_own_name_and_address_are_refused(monkeypatch, settings):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "crucible-box")
    fake_dns(monkeypatch, {"crucible-box": ["203.0.113.7"], "hooks.example.com": ["203.0.113.7"]})
    with pytest.raises(WebhookRefused, match="own name"):
        webhook_url_check("http://crucible-box/hook")
    with pytest.raises(WebhookRefused, match="this server's own address"):
        webhook_url_check("http://hooks.example.com/hook")


def test_loopback_is_allowed_only_when_the_administrator_says_so(config):
    with pytest.raises(WebhookRefused, match="CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK"):
        webhook_url_check("http://127.0.0.1:9/hook")
    config(webhook_allow_loopback=True)
    assert webhook_url_check("http://127.0.0.1:9/hook").address == "127.0.0.1"
    with pytest.raises(WebhookRefused, match="link-local"):  # the rest stays refused
        webhook_url_check("http://169.254.169.254/")


def test_the_address_is_checked_again_at_delivery_time(personas, monkeypatch):
    answers = fake_dns(monkeypatch, {"hooks.example.com": ["93.184.215.14"]})
    webhook_create(personas.owner, personas.alpha, "team", "https://hooks.example.com/x", SECRET)
    delivery = WebhookDelivery.objects.get(pk=send(personas.alpha)["deliveries"][0])
    answers["hooks.example.com"] = ["169.254.169.254"]  # DNS changed since the webhook was added
    webhook_delivery_attempt(delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state == "failed" and "link-local" in delivery.last_error
    receipt = Receipt.objects.get(subject_type="webhook_delivery", subject_id=delivery.pk)
    assert receipt.outcome == "did not run" and "refused" in receipt.error


# ---------------------------------------------------------------------------------------- pages


def test_the_account_page_saves_notification_settings(personas):
    client = login(personas.member)
    page = text_of(client.get("/account/"))
    assert "A winner I may approve is waiting" in page and "Someone replied where I commented" in page
    response = client.post("/account/notifications/", {"email_address": "m@example.com", "email": "on",
                                                       "approval_waiting": "on", "replies": "on"})
    assert response.status_code == 302
    setting = NotificationSetting.objects.get(user=personas.member)
    chosen = (setting.email, setting.approval_waiting, setting.search_done, setting.replies)
    assert chosen == (True, True, False, True)
    personas.member.refresh_from_db()
    assert personas.member.email == "m@example.com"


def test_the_account_page_explains_a_bad_address(personas):
    response = login(personas.member).post("/account/notifications/", {"email_address": "not-an-address",
                                                                      "email": "on"})
    assert response.status_code == 400 and "Enter a valid email address" in text_of(response)
    response = login(personas.member).post("/account/notifications/", {"email_address": "", "email": "on"})
    assert response.status_code == 400 and "Give an email address, or turn email off" in text_of(response)
    assert not NotificationSetting.objects.exists()


def test_notification_settings_and_webhooks_need_the_csrf_token(personas, loopback):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.owner)
    assert client.post("/account/notifications/", {"email_address": "o@example.com"}).status_code == 403
    assert client.post(f"/projects/{personas.alpha.pk}/webhooks/",
                       {"name": "team", "url": "http://127.0.0.1:9/hook"}).status_code == 403
    assert not NotificationSetting.objects.exists() and not Webhook.objects.exists()


def test_a_project_admin_adds_lists_and_deactivates_webhooks_on_its_page(personas, loopback):
    client = login(personas.owner)
    url = f"/projects/{personas.alpha.pk}/webhooks/"
    assert url in client.get(f"/projects/{personas.alpha.pk}/").content.decode()
    response = client.post(url, {"name": "team", "url": "http://127.0.0.1:9/hook"})
    assert response.status_code == 200  # Crucible made the secret: shown on this response only
    webhook = Webhook.objects.get()
    assert notifications._secret_of(webhook) in text_of(response)
    page = text_of(client.get(f"/projects/{personas.alpha.pk}/webhooks/"))
    assert "team" in page and "http://127.0.0.1:9/…" in page and notifications._secret_of(webhook) not in page
    send(personas.alpha)
    webhook_delivery_attempt(WebhookDelivery.objects.get().pk)  # nothing listens on port 9
    page = text_of(client.get(f"/projects/{personas.alpha.pk}/webhooks/"))
    assert "search.finished" in page and "pending" in page and "#" in page
    assert client.post(f"/projects/{personas.alpha.pk}/webhooks/{webhook.pk}/deactivate/").status_code == 302
    webhook.refresh_from_db()
    assert not webhook.active


def test_the_webhooks_page_refuses_a_bad_url_with_its_reason(personas):
    response = login(personas.owner).post(f"/projects/{personas.alpha.pk}/webhooks/",
                                          {"name": "meta", "url": "http://169.254.169.254/latest/"})
    assert response.status_code == 400 and "link-local" in text_of(response)
    assert not Webhook.objects.exists()


def test_the_webhooks_page_is_for_project_admins_only(personas, loopback):
    viewer = make_user("viewer-only")
    personas.alpha.memberships.create(user=viewer)
    url = f"/projects/{personas.alpha.pk}/webhooks/"
    assert login(viewer).get(url).status_code == 403
    assert login(viewer).post(url, {"name": "x", "url": "http://127.0.0.1:9/h"}).status_code == 403
    assert login(personas.outsider).get(url).status_code == 404  # not a member: learns nothing
    webhook, _ = webhook_create(personas.owner, personas.alpha, "team", "http://127.0.0.1:9/hook", SECRET)
    assert login(viewer).post(f"{url}{webhook.pk}/delete/").status_code == 403
    assert Webhook.objects.filter(pk=webhook.pk).exists()
    project_page = login(viewer).get(f"/projects/{personas.alpha.pk}/").content.decode()
    assert "project's project admins manage" in project_page
    assert login(personas.member).get(url).status_code == 403  # an operator is not a project admin


# ---------------------------------------------------------------------------------------- settings


def test_email_goes_to_the_console_unless_configured():
    from crucible.config import load

    assert load({}).email_backend == "console"
    assert not load({}).webhook_allow_loopback and load({}).webhook_retry_seconds == 30


@pytest.mark.parametrize(("environ", "named"), [
    ({"CRUCIBLE_EMAIL_BACKEND": "pigeon"}, "CRUCIBLE_EMAIL_BACKEND"),
    ({"CRUCIBLE_EMAIL_SECURITY": "tls1"}, "CRUCIBLE_EMAIL_SECURITY"),
    ({"CRUCIBLE_EMAIL_PORT": "smtp"}, "CRUCIBLE_EMAIL_PORT"),
    ({"CRUCIBLE_EMAIL_FROM": "nobody"}, "CRUCIBLE_EMAIL_FROM"),
    ({"CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK": "maybe"}, "CRUCIBLE_WEBHOOK_ALLOW_LOOPBACK"),
    ({"CRUCIBLE_WEBHOOK_RETRY_SECONDS": "-1"}, "CRUCIBLE_WEBHOOK_RETRY_SECONDS"),
])
def test_a_malformed_notification_setting_is_refused_by_name(environ, named):
    from crucible.config import ConfigError, load

    with pytest.raises(ConfigError, match=named):
        load(environ)
