"""The page addresses the CLI prints: the public origin when configured, else where `serve` listens."""

from __future__ import annotations

import dataclasses

from runtime_app.selectors import page_url


def configure(settings, **values) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, **values)


def test_a_page_url_is_where_serve_listens(settings):
    configure(settings, host="127.0.0.1", port=8123, https=False, csrf_trusted_origins=[])
    assert page_url("/searches/search-1/") == "http://127.0.0.1:8123/searches/search-1/"


def test_a_wildcard_bind_address_is_shown_as_this_machines_loopback(settings):
    configure(settings, host="0.0.0.0", port=8000, https=True, csrf_trusted_origins=[])  # noqa: S104
    assert page_url("/agents/") == "https://127.0.0.1:8000/agents/"


def test_the_public_origin_wins_when_one_is_configured(settings):
    configure(settings, csrf_trusted_origins=["https://crucible.example/", "https://other.example"])
    assert page_url("/agents/1/runs/2/") == "https://crucible.example/agents/1/runs/2/"
