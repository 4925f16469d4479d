"""Every URL pattern needs a login: walk the URL conf, so new pages are covered too."""

from __future__ import annotations

import functools
import re

import pytest
from django.conf import settings
from django.shortcuts import resolve_url
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from tests.helpers import PublishedSchema

# Pages that must be reachable logged out, and nothing else.
PUBLIC = {"/login/", "/admin/login/", "/password/reset/", "/password/reset/sent/",
          # A password link's signed token is the key here, logged out.
          "/reset/1/1/", "/reset/done/"}
# An invitee opens their link logged out: a made-up token gets a page saying so (404), never a login.
PUBLIC_REFUSING = {"/invitations/1/": 404}
# … and these, which only point at a public static file.
PUBLIC_REDIRECTS = {"/favicon.ico": "/static/favicon.svg"}
# Workers fetch baselines here with a per-search token, not a login (search_app/git_http.py).
TOKEN_AUTH = "/git/searches/"
# The two requests the token route serves: without a token, each is refused with 401.
TOKEN_AUTH_REQUESTS = [("get", "/git/searches/1.git/info/refs?service=git-upload-pack"),
                       ("post", "/git/searches/1.git/git-upload-pack")]
# URLs of the walk that answer 404 to GET and POST alike, logged in or not.
NOT_FOUND = {"/api/",  # django-ninja's mount point: no route of its own
             "/git/searches/1.git/1"}  # the walk's filler: not one of the two requests the route serves


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
    if url in PUBLIC_REFUSING:
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            assert response.status_code == PUBLIC_REFUSING[url], (method, url, response.status_code)
            assert "cannot be used" in response.content.decode()
        return
    if url in PUBLIC_REDIRECTS:
        response = client.get(url)
        assert response.status_code == 301 and response["Location"] == PUBLIC_REDIRECTS[url]
        return
    for method in ("get", "post"):
        response = getattr(client, method)(url)
        status = response.status_code
        if url in NOT_FOUND:
            assert status == 404, (method, url, status)
        elif url.startswith(TOKEN_AUTH):
            pytest.fail(f"{url}: a new token-auth URL; say what it answers in TOKEN_AUTH_REQUESTS")
        elif url.startswith("/api/") and not url.startswith("/api/docs") and "openapi" not in url:
            # 401 for a method the published schema lists for the route, 405 for any other.
            assert status == (401 if method in api_methods(url) else 405), (method, url, status)
        else:
            assert status == 302, (method, url, status)
            # The login page the view names (the admin site's own views name the admin's), else
            # LOGIN_URL: the one page LoginRequiredMiddleware sends it to.
            login_url = resolve_url(getattr(resolve(url).func, "login_url", None) or settings.LOGIN_URL)
            assert response["Location"].startswith(f"{login_url}?next="), (method, url, response["Location"])


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "url"), TOKEN_AUTH_REQUESTS)
def test_the_token_route_refuses_a_request_without_its_token(client, method, url):
    assert getattr(client, method)(url).status_code == 401


@functools.cache
def published_schema() -> PublishedSchema:
    return PublishedSchema.load()


def api_methods(url: str) -> set[str]:
    """The methods /api/openapi.json lists for the route `url` falls under (none: not an API route)."""
    schema = published_schema()
    templates = [template for pattern, template in schema.routes if pattern.match(url)]
    return set(schema.document["paths"][templates[0]]) if templates else set()
