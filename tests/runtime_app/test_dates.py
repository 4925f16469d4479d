"""One date format on every page: 2026-12-03 14:05 UTC."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pytest

from runtime_app.services import event_emit
from runtime_app.templatetags.crucible_dates import when
from tests.helpers import REPO_ROOT, login


def test_a_moment_reads_in_utc_to_the_minute():
    assert when(datetime(2026, 12, 3, 14, 5, 59, tzinfo=UTC)) == "2026-12-03 14:05 UTC"


def test_a_moment_in_another_zone_is_turned_to_utc():
    paris = timezone(timedelta(hours=1))
    assert when(datetime(2026, 12, 3, 15, 5, tzinfo=paris)) == "2026-12-03 14:05 UTC"


def test_a_plain_date_and_nothing_read_as_such():
    assert when(date(2026, 12, 3)) == "2026-12-03"
    assert when(None) == "" and when("") == ""


def test_no_template_formats_a_date_its_own_way():
    # Every shown date goes through |when; only the machine-readable `c` (ISO 8601) stays.
    for path in Path(REPO_ROOT / "templates").rglob("*.html"):
        own = re.findall(r"\|date:\"[^\"]*\"", path.read_text())
        assert own == [], f"{path}: {own}"


@pytest.mark.django_db
def test_the_activity_log_shows_the_one_format(personas):
    event = event_emit(personas.alpha, "project", personas.alpha.pk, "test.dated", {"message": "dated"})
    page = login(personas.owner).get("/").content.decode()
    assert f">{when(event.created_at)}</time>" in page
    assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d UTC</time>", page)
