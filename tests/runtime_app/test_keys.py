"""Provider keys an administrator stores: encrypted at rest, used when the environment has none."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client

from runtime_app.keys import provider_key, provider_key_set
from runtime_app.models import AuditEntry, ProviderKey

pytestmark = pytest.mark.django_db
SECRET = "sk-ant-stored-secret-0123456789"


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("root", password="pw-root-1234")


def test_a_stored_key_is_encrypted_and_used_when_the_environment_has_none(admin_user, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    stored = provider_key_set(admin_user, "ANTHROPIC_API_KEY", SECRET)
    assert SECRET not in stored.ciphertext and stored.hint == "6789"
    assert provider_key("ANTHROPIC_API_KEY") == SECRET
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-the-environment")
    assert provider_key("ANTHROPIC_API_KEY") == "from-the-environment"
    entry = AuditEntry.objects.get(action="provider_key.set")
    assert SECRET not in str(entry.detail) + entry.target and entry.target.endswith("…6789")


def test_a_changed_secret_key_makes_a_stored_key_unreadable_not_an_error(admin_user, settings, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider_key_set(admin_user, "OPENAI_API_KEY", SECRET)
    settings.SECRET_KEY = "another-secret-key-" + "x" * 40
    assert provider_key("OPENAI_API_KEY") is None


def test_only_administrators_store_keys_and_only_known_variables(admin_user, personas):
    with pytest.raises(PermissionDenied):
        provider_key_set(personas.owner, "ANTHROPIC_API_KEY", SECRET)
    with pytest.raises(ValidationError, match="Choose one of"):
        provider_key_set(admin_user, "PATH", SECRET)
    with pytest.raises(ValidationError, match="at least 8"):
        provider_key_set(admin_user, "ANTHROPIC_API_KEY", "short")


def test_the_admin_page_takes_a_key_write_only(admin_user):
    client = Client()
    client.force_login(admin_user)
    response = client.post("/admin/runtime_app/providerkey/add/",
                           {"variable": "DEEPSEEK_API_KEY", "value": SECRET})
    assert response.status_code == 302
    assert ProviderKey.objects.get().hint == "6789"
    listing = client.get("/admin/runtime_app/providerkey/").content.decode()
    stored = ProviderKey.objects.get()
    change = client.get(f"/admin/runtime_app/providerkey/{stored.pk}/change/").content.decode()
    assert SECRET not in listing + change and "6789" in listing
    short = client.post("/admin/runtime_app/providerkey/add/", {"variable": "OPENAI_API_KEY", "value": "abc"})
    assert short.status_code == 200 and "at least 8 characters" in short.content.decode()


def test_staff_who_are_not_superusers_cannot_see_keys(django_user_model):
    staff = django_user_model.objects.create_user("staff", password="pw-staff-1234", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/runtime_app/providerkey/").status_code == 403
