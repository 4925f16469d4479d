"""Provider API keys: from the workers' environment first, else an administrator's stored key.

Stored keys are encrypted with Fernet under a key derived from Django's secret key; changing
the secret key makes them unreadable (re-enter them). Nothing here logs a key.
"""

from __future__ import annotations

import base64
import hashlib
import os

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app import access
from runtime_app.models import ProviderKey
from runtime_app.records import audit_record

VARIABLE_CHOICES = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "DEEPSEEK_API_KEY", "LOCAL_LLM_API_KEY",
                    "AWS_BEARER_TOKEN_BEDROCK")


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"crucible provider keys\0" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def provider_key_set(user: AbstractBaseUser, variable: str, value: str) -> ProviderKey:
    """Store (or replace) a key; superusers only."""
    try:
        access.require(user, access.ADMINISTER)
    except PermissionDenied:  # the rule is access's; the words say what was refused
        raise PermissionDenied("Only administrators can store provider keys.") from None
    if variable not in VARIABLE_CHOICES:
        raise ValidationError({"variable": f"Choose one of {', '.join(VARIABLE_CHOICES)}."})
    value = (value or "").strip()
    if len(value) < 8 or any(c.isspace() for c in value):
        raise ValidationError({"value": "Paste the whole key: at least 8 characters, no spaces."})
    key, _ = ProviderKey.objects.update_or_create(
        variable=variable,
        defaults={"ciphertext": _fernet().encrypt(value.encode()).decode(), "hint": value[-4:],
                  "updated_by": user},
    )
    audit_record(user, "provider_key.set", target=f"{variable} …{value[-4:]}")
    return key


def provider_key(variable: str) -> str | None:
    """The key for `variable`: the environment's, else the stored one, else None."""
    if os.environ.get(variable):
        return os.environ[variable]
    stored = ProviderKey.objects.filter(variable=variable).first()
    if stored is None:
        return None
    try:
        return _fernet().decrypt(stored.ciphertext.encode()).decode()
    except InvalidToken:
        return None  # the secret key changed since it was stored: an administrator re-enters it
