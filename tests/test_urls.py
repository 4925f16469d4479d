"""Every URL pattern needs a login: walk the URL conf, so new pages are covered too."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

# Pages that must be reachable logged out, and nothing else.
PUBLIC = {"/login/", "/admin/login/",
          # An invitee sets their password here, logged out: the link's signed token is the key.
          "/reset/1/1/", "/reset/done/"}
# … and these, which only point at a public static file.
PUBLIC_REDIRECTS = {"/favicon.ico": "/static/favicon.svg"}
# Workers fetch baselines here with a per-search token, not a login (search_app/git_http.py).
TOKEN_AUTH = "/git/searches/"


def _walk(patterns, prefix: str = ""):
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route


def _concrete(route: str) -> str:
    """Turn a route or regex into a URL, filling each parameter with 1."""
    path = re.sub(r"<(?:\w+:)?\w+>", "1", route)
    path = re.sub(r"\(\?P<\w+>[^)]*\)", "1", path)
    path = path.replace("^", "").replace("$", "").replace("\\Z", "").replace("\\", "")
    path = re.sub(r"\(\?:[^)]*\)\??", "", path)
    return "/" + path.lstrip("/")


ROUTES = sorted({_concrete(route) for route in _walk(get_resolver().url_patterns)})


def test_the_url_walk_finds_the_pages_and_the_api():
    assert "/" in ROUTES
    assert "/api/health" in ROUTES
    assert any(route.startswith("/admin/") for route in ROUTES)


@pytest.mark.django_db
@pytest.mark.parametrize("url", ROUTES)
def test_every_url_refuses_anonymous_visitors(client, url):
    if url in PUBLIC:
        assert client.get(url).status_code == 200
        if url.startswith("/reset/1/"):  # a made-up token sets nothing
            assert "invalid" in client.get(url).content.decode().lower()
            assert client.post(url, {"new_password1": "x-Long-pass-42", "new_password2": "x-Long-pass-42"}
                               ).status_code == 200
        return
    if url in PUBLIC_REDIRECTS:
        response = client.get(url)
        assert response.status_code == 301 and response["Location"] == PUBLIC_REDIRECTS[url]
        return
    for method in ("get", "post"):
        response = getattr(client, method)(url)
        if url.startswith(TOKEN_AUTH):
            assert response.status_code in {401, 403, 404, 405}, (method, url, response.status_code)
        elif url.startswith("/api/") and not url.startswith("/api/docs") and "openapi" not in url:
            assert response.status_code in {401, 404, 405}, (method, url, response.status_code)
            assert response.status_code != 200
        else:
            assert response.status_code in {302, 404, 405}, (method, url, response.status_code)
            if response.status_code == 302:
                location = response["Location"]
                assert "/login/" in location, (method, url, location)
