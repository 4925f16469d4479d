"""Rounds are numbered from 0 on every page, as the run, its events, its receipts and the CLI do."""

from __future__ import annotations

import re

import pytest

from tests.helpers import login
from tests.search_app.runs import spec_text


def funnel_rounds(page: str) -> list[str]:
    return re.findall(r'<span class="funnel-round">round (\d+)</span>', page)


@pytest.mark.django_db
def test_the_spec_editor_numbers_the_rounds_from_zero(personas):
    page = login(personas.member).post("/searches/specs/validate/", {
        "text": spec_text(population=4, rounds=[4, 2, 1])}).content.decode()
    assert funnel_rounds(page) == ["0", "1", "2"]


@pytest.mark.django_db(transaction=True)
def test_the_search_page_numbers_the_rounds_from_zero_like_its_candidates(finished, personas):
    search, winner, _ = finished
    client = login(personas.member)
    assert funnel_rounds(client.get(f"/searches/{search.search_id}/").content.decode()) == ["0", "1"]
    candidate = client.get(f"/searches/{search.search_id}/candidates/{winner.candidate_id}/").content.decode()
    assert "<dt>Round reached</dt><dd>1</dd>" in candidate  # the last of rounds [2, 1]
