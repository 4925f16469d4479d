"""ASGI entry point: HTTP through Django, websockets through authenticated consumers."""

import os
from typing import Any
from urllib.parse import urlsplit

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402

from crucible.routing import websocket_urlpatterns  # noqa: E402

DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


def _origin(text: str) -> Origin | None:
    """(scheme, host, port) of an http(s) origin with nothing after the port, else None."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.fragment \
            or parts.username is not None or parts.password is not None:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def _served_over_https(scope: dict[str, Any], headers: dict[bytes, bytes]) -> bool:
    """wss, or http behind the TLS proxy that SECURE_PROXY_SSL_HEADER trusts (as Django does)."""
    if scope.get("scheme") == "wss":
        return True
    trusted = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if not trusted:
        return False
    header, value = trusted
    name = header.removeprefix("HTTP_").replace("_", "-").lower().encode()
    return headers.get(name, b"").decode("latin1").split(",")[0].strip() == value


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Whether a websocket handshake comes from the page's own origin (scheme from the
    connection, http↔ws and https↔wss; host and port from an allowed Host header) or exactly
    from one of CSRF_TRUSTED_ORIGINS. No Origin header, or an opaque one, is refused."""
    headers = {name.lower(): value for name, value in scope.get("headers", [])}
    origin = _origin(headers.get(b"origin", b"").decode("latin1"))
    host = headers.get(b"host", b"").decode("latin1").strip()
    domain, _ = split_domain_port(host)
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:  # Django's own fallback in HttpRequest.get_host
        allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
    if origin is None or not domain or not validate_host(domain, allowed_hosts):
        return False
    scheme = "https" if _served_over_https(scope, headers) else "http"
    if origin == _origin(f"{scheme}://{host}"):
        return True
    return any(origin == _origin(trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS)


class SameOriginWebsockets:
    """Admits a websocket only from the page's own origin or a trusted one (origin_allowed);
    channels' AllowedHostsOriginValidator compared host names only, not scheme and port."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginWebsockets(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
