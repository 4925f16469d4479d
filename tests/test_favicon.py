"""Every page names the favicon, and /favicon.ico (which browsers ask for anyway) finds it."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.helpers import REPO_ROOT, login

pytestmark = pytest.mark.django_db


def test_the_favicon_is_a_static_svg_linked_from_every_page(personas):
    page = login(personas.owner).get("/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
    assert (REPO_ROOT / "static" / "favicon.svg").read_text().startswith("<svg ")


def test_favicon_ico_redirects_to_it_without_a_login():
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"
