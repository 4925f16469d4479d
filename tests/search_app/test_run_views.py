"""The search page's run card: start and cancel buttons for operators, the outcome for all."""

from __future__ import annotations

import pytest
from django.test import Client

from runtime_app.models import ProjectMembership
from search_app import services
from search_app.models import SearchRun
from tests.helpers import login, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_starts_the_search_from_its_page_and_sees_the_outcome(personas, small_search):
    client = login(personas.member)
    page = client.get(f"/searches/{small_search.search_id}/").content.decode()
    assert "Start the search" in page and "Not started" in page
    response = client.post(f"/searches/{small_search.search_id}/start/")
    assert response.status_code == 302 and SearchRun.objects.filter(search=small_search).exists()
    running = client.get(f"/searches/{small_search.search_id}/").content.decode()
    # The page follows the run over its websocket (the event log's ws-connect), not by polling.
    assert f'ws-connect="/ws/events/search/{small_search.pk}/"' in running and 'id="cancel-search"' in running
    services.search_run_inline(small_search)
    card = client.get(f"/searches/{small_search.search_id}/run/").content.decode()
    assert "Winner <a" in card and "<strong>cand_001</strong>" in card and "every 2s" not in card
    assert "patch refused at policy" in card and "tests/test_answer.py" in card


def test_a_viewer_sees_no_buttons_and_cannot_start(personas, small_search):
    viewer = make_user("viewer-only")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    client = login(viewer)
    assert "Start the search" not in client.get(f"/searches/{small_search.search_id}/").content.decode()
    assert client.post(f"/searches/{small_search.search_id}/start/").status_code == 403
    assert not SearchRun.objects.exists()


def test_an_outsider_gets_404_everywhere(personas, small_search):
    client = login(personas.outsider)
    for url in ("run/", "start/", "cancel/"):
        method = client.get if url == "run/" else client.post
        assert method(f"/searches/{small_search.search_id}/{url}").status_code == 404


def test_cancelling_a_search_that_never_started_says_so(personas, small_search):
    client = login(personas.member)
    response = client.post(f"/searches/{small_search.search_id}/cancel/", follow=True)
    assert "This search has not started." in response.content.decode()


def test_start_needs_a_post_with_csrf(personas, small_search):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.member)
    assert client.get(f"/searches/{small_search.search_id}/start/").status_code == 405
    assert client.post(f"/searches/{small_search.search_id}/start/").status_code == 403
