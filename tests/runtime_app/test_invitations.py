"""Invitations: the inviter sees the link once (only its hash is stored), every member sees what
is pending and until when, a project admin resends (new link, old one dead) or revokes, and the
invitee sets a password on Crucible's own page and lands signed in in the project. A link that
cannot be used says why, never a 500. The password pages are Crucible's, not the admin's."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.utils import timezone

from runtime_app import access
from runtime_app.models import AuditEntry, Invitation
from tests.helpers import login, make_user, text_of

pytestmark = pytest.mark.django_db
PASSWORD = "a-Long-new-pass-42"


@pytest.fixture(autouse=True)
def _mail_in_memory(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def members_url(personas) -> str:
    return f"/projects/{personas.alpha.pk}/members/"


def invite(client: Client, personas, email: str = "grace@example.org", role: str = "viewer") -> str:
    """Invite `email` from the members page; the link the page shows once (a path)."""
    page = client.post(f"{members_url(personas)}add/", {"who": email, "role": role}, follow=True)
    assert page.status_code == 200, text_of(page)
    return link_on(page)


def link_on(response) -> str:
    found = re.search(r'<code id="invitation-url"[^>]*>http://testserver(/invitations/[^<]+/)</code>',
                      response.content.decode())
    assert found, "no invitation link on the page"
    return found.group(1)


def accept(link: str, password: str = PASSWORD) -> tuple[Client, object]:
    invitee = Client()
    return invitee, invitee.post(link, {"new_password1": password, "new_password2": password})


# ------------------------------------------------------------------------------ inviting


def test_the_inviter_sees_the_link_once_with_a_copy_button_and_only_its_hash_is_stored(personas):
    owner = login(personas.owner)
    page = owner.post(f"{members_url(personas)}add/", {"who": "Grace@Example.org", "role": "operator"},
                      follow=True)
    link = link_on(page)
    token = link.split("/")[2]
    assert "Invited grace@example.org as operator." in text_of(page)
    assert 'data-copy="invitation-url"' in page.content.decode() and "shown only this once" in text_of(page)
    [invitation] = Invitation.objects.all()
    assert invitation.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    stored = " ".join(str(value) for value in Invitation.objects.values().first().values())
    audits = " ".join(str(entry.detail) + entry.target for entry in AuditEntry.objects.all())
    assert token not in stored and token not in audits
    # The email carries the same link; the next visit to the page no longer shows it.
    [message] = mail.outbox
    assert message.to == ["grace@example.org"] and f"http://testserver{link}" in message.body
    again = text_of(owner.get(members_url(personas)))
    assert token not in again and "grace@example.org" in again
    # No account exists until the invitee accepts.
    assert not get_user_model().objects.filter(email="grace@example.org").exists()


def test_every_member_sees_pending_invitations_with_their_expiry_but_only_an_admin_may_act(personas):
    invite(login(personas.owner), personas)
    invitation = Invitation.objects.get()
    assert invitation.expires_at - invitation.sent_at == timedelta(days=7)
    page = login(personas.member).get(members_url(personas))  # an operator
    pending = page.content.decode().split('id="pending-invitations"')[1]
    assert "grace@example.org" in pending and invitation.expires_at.strftime("%Y-%m-%d") in pending
    assert "Resend" not in pending and "Revoke" not in pending
    assert "1 pending invitation" in text_of(login(personas.member).get(f"/projects/{personas.alpha.pk}/"))
    for action in ("resend", "revoke"):
        url = f"/projects/{personas.alpha.pk}/invitations/{invitation.pk}/{action}/"
        assert login(personas.member).post(url).status_code == 403
        assert login(personas.outsider).post(url).status_code == 404
    invitation.refresh_from_db()
    assert invitation.state == Invitation.State.PENDING and invitation.sends == 1


def test_the_invitation_actions_need_a_csrf_token(personas):
    invite(login(personas.owner), personas)
    invitation = Invitation.objects.get()
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.owner)
    for action in ("resend", "revoke"):
        url = f"/projects/{personas.alpha.pk}/invitations/{invitation.pk}/{action}/"
        assert client.post(url).status_code == 403
    assert Invitation.objects.get().state == Invitation.State.PENDING


def test_inviting_an_address_again_renews_its_pending_invitation(personas):
    owner = login(personas.owner)
    first = invite(owner, personas)
    second = invite(owner, personas, role="approver")
    invitation = Invitation.objects.get()
    assert invitation.role == access.APPROVER and invitation.sends == 2
    assert Client().get(first).status_code == 404 and Client().get(second).status_code == 200


# ------------------------------------------------------------------------------ accepting


def test_the_invitee_sets_a_password_on_crucibles_page_and_lands_signed_in_in_the_project(personas):
    link = invite(login(personas.owner), personas, email="grace.hopper@example.org", role="operator")
    form = Client().get(link)
    assert form.status_code == 200 and form["Referrer-Policy"] == "same-origin"
    words = text_of(form)
    assert "Join alpha on Crucible" in words and "grace.hopper" in words and "operator" in words
    assert "Django administration" not in words
    invitee, done = accept(link)
    assert done.status_code == 302 and done["Location"] == f"/projects/{personas.alpha.pk}/"
    landed = invitee.get(done["Location"])
    assert landed.status_code == 200 and "Welcome to alpha, grace.hopper" in text_of(landed)
    grace = get_user_model().objects.get(email="grace.hopper@example.org")
    assert grace.check_password(PASSWORD) and access.role_in(grace, personas.alpha) == access.OPERATOR
    invitation = Invitation.objects.get()
    assert invitation.state == Invitation.State.ACCEPTED and invitation.accepted_by == grace
    assert "grace.hopper@example.org" not in text_of(login(personas.owner).get(members_url(personas))
                                                     ).split("Pending invitations")[1]
    # The link worked once: now it says so, and sets nothing.
    used = Client().get(link)
    assert used.status_code == 410 and "already used" in text_of(used)
    assert accept(link, "another-Long-pass-7")[1].status_code == 410
    assert AuditEntry.objects.filter(action="project.member_add", target="grace.hopper",
                                     detail__invited_by="owner").exists()


def test_a_password_the_validators_refuse_makes_no_account(personas):
    link = invite(login(personas.owner), personas)
    _, weak = accept(link, "123")
    assert weak.status_code == 400 and "too short" in text_of(weak)
    mismatched = Client().post(link, {"new_password1": PASSWORD, "new_password2": PASSWORD + "x"})
    assert mismatched.status_code == 400 and "didn" in text_of(mismatched)
    assert not get_user_model().objects.filter(email="grace@example.org").exists()
    assert Invitation.objects.get().state == Invitation.State.PENDING


def test_accepting_joins_every_project_with_an_open_invitation_for_the_same_address(personas):
    link = invite(login(personas.owner), personas, role="viewer")
    beta = login(personas.outsider)
    beta.post(f"/projects/{personas.beta.pk}/members/add/", {"who": "grace@example.org", "role": "approver"})
    accept(link)
    grace = get_user_model().objects.get(email="grace@example.org")
    assert access.role_in(grace, personas.alpha) == access.VIEWER
    assert access.role_in(grace, personas.beta) == access.APPROVER
    assert set(Invitation.objects.values_list("state", flat=True)) == {Invitation.State.ACCEPTED}


# ------------------------------------------------------------------------------ links that refuse


def test_resend_makes_a_new_link_shown_once_and_the_old_one_refuses(personas):
    owner = login(personas.owner)
    old = invite(owner, personas)
    invitation = Invitation.objects.get()
    page = owner.post(f"/projects/{personas.alpha.pk}/invitations/{invitation.pk}/resend/", follow=True)
    new = link_on(page)
    assert new != old and "the previous link no longer works" in text_of(page)
    refused = Client().get(old)
    assert refused.status_code == 404 and "replaced by a newer link" in text_of(refused)
    assert Client().get(new).status_code == 200 and len(mail.outbox) == 2
    assert Invitation.objects.get().sends == 2


def test_a_revoked_link_refuses_with_a_clear_page(personas):
    owner = login(personas.owner)
    link = invite(owner, personas)
    invitation = Invitation.objects.get()
    page = owner.post(f"/projects/{personas.alpha.pk}/invitations/{invitation.pk}/revoke/", follow=True)
    assert "Revoked the invitation of grace@example.org" in text_of(page)
    assert "No pending invitations." in text_of(page)
    for response in (Client().get(link), accept(link)[1]):
        assert response.status_code == 410 and "was revoked" in text_of(response)
    assert not get_user_model().objects.filter(email="grace@example.org").exists()
    # Revoking twice, or resending a revoked invitation, is refused in words.
    again = owner.post(f"/projects/{personas.alpha.pk}/invitations/{invitation.pk}/resend/", follow=True)
    assert "was revoked already" in text_of(again)
    assert AuditEntry.objects.filter(action="invitation.revoke", target="grace@example.org").exists()


def test_a_refused_link_is_logged_by_its_first_characters_only(personas, caplog):
    owner = login(personas.owner)
    link = invite(owner, personas)
    token = link.split("/")[2]
    owner.post(f"/projects/{personas.alpha.pk}/invitations/{Invitation.objects.get().pk}/revoke/")
    with caplog.at_level("INFO"):
        assert Client().get(link).status_code == 410
    assert f"token {token[:6]}…)" in caplog.text and "revoked" in caplog.text
    assert token not in caplog.text


def test_an_expired_link_says_when_it_expired_and_a_resend_renews_it(personas):
    owner = login(personas.owner)
    link = invite(owner, personas)
    Invitation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    refused = Client().get(link)
    assert refused.status_code == 410 and "expired on" in text_of(refused) and "resend" in text_of(refused)
    listed = text_of(owner.get(members_url(personas)))
    assert "expired" in listed.split("Pending invitations")[1]
    invitation = Invitation.objects.get()
    new = link_on(owner.post(f"/projects/{personas.alpha.pk}/invitations/{invitation.pk}/resend/",
                             follow=True))
    assert Client().get(new).status_code == 200


@pytest.mark.parametrize("token", ["nope", "x" * 43, "a" * 500, "%00"])
def test_a_made_up_link_gets_a_clear_page_not_a_500(personas, token):
    response = Client().get(f"/invitations/{token}/")
    assert response.status_code == 404 and "This invitation link cannot be used" in text_of(response)


# ------------------------------------------------------------------------------ the API


def test_the_api_lists_creates_resends_and_revokes_invitations_like_the_page(personas):
    owner, base = login(personas.owner), f"/api/projects/{personas.alpha.pk}/invitations"
    created = owner.post(base, {"email": "ada@example.org", "role": "approver"},
                         content_type="application/json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["status"] == "pending" and body["role"] == "approver" and "/invitations/" in body["link"]
    listed = login(personas.member).get(base).json()
    assert [(row["email"], row["status"]) for row in listed] == [("ada@example.org", "pending")]
    assert "link" not in listed[0]
    assert login(personas.member).post(f"{base}/{body['id']}/revoke").status_code == 403
    resent = owner.post(f"{base}/{body['id']}/resend").json()
    assert resent["link"] != body["link"] and resent["sends"] == 2
    assert Client().get(body["link"].removeprefix("http://testserver")).status_code == 404
    revoked = owner.post(f"{base}/{body['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert owner.get(base).json() == []
    assert owner.post(f"{base}/{body['id']}/revoke").status_code == 400
    assert owner.post(f"{base}/999/revoke").status_code == 404
    assert login(personas.outsider).get(base).status_code == 404
    taken = make_user("taken")
    taken.email = "taken@example.org"
    taken.save()
    refused = owner.post(base, {"email": "taken@example.org"}, content_type="application/json")
    assert refused.status_code == 400 and "add it by username" in refused.json()["detail"]


# ------------------------------------------------------------------------------ password pages


def test_every_password_page_is_crucibles_own_not_the_admins(personas):
    signed_in = login(personas.owner)
    pages = {url: Client().get(url) for url in ("/login/", "/password/reset/", "/password/reset/sent/",
                                                "/reset/MQ/made-up/", "/reset/done/", "/invitations/x/")}
    pages |= {url: signed_in.get(url) for url in ("/account/password/", "/account/password/done/")}
    for url, response in pages.items():
        html = response.content.decode()
        assert "Django administration" not in html and "Django site admin" not in html, url
        assert 'class="topbar"' in html and "css/crucible.css" in html, url


def test_a_forgotten_password_is_reset_from_an_emailed_link_on_crucibles_pages(personas):
    get_user_model().objects.filter(pk=personas.member.pk).update(email="member@example.org")
    anonymous = Client()
    sent = anonymous.post("/password/reset/", {"email": "member@example.org"}, follow=True)
    assert "Check your email" in text_of(sent)
    [message] = mail.outbox
    link = re.search(r"http://testserver(/reset/\S+)", message.body).group(1)
    form = anonymous.get(link, follow=True)
    assert "Set your password" in text_of(form) and "member" in text_of(form)
    done = anonymous.post(form.redirect_chain[-1][0], {"new_password1": PASSWORD, "new_password2": PASSWORD},
                          follow=True)
    assert "Password set" in text_of(done)
    personas.member.refresh_from_db()
    assert personas.member.check_password(PASSWORD)
