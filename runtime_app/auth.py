"""API authentication: the browser's session (with CSRF) or a personal bearer token."""

from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer, django_auth

from runtime_app.services import api_token_authenticate


class ApiTokenAuth(HttpBearer):
    """`Authorization: Bearer crc_…` from the account page."""

    def authenticate(self, request: HttpRequest, token: str) -> Any | None:
        user = api_token_authenticate(token)
        if user is not None:
            request.user = user
        return user


api_auth = [ApiTokenAuth(), django_auth]
