"""Big patches on pages: the candidate, decision and compare pages show the first part of a
large (but allowed) patch, say what was left out, and link to the whole patch as a download,
which needs a login and the same access to the search as the page (404 for outsiders)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from search_app.models import Candidate
from search_app.presenters import PAGE_PATCH_MAX_BYTES, patch_shown
from tests.helpers import login
from tests.search_app.runs import frozen, run_inline

pytestmark = pytest.mark.django_db(transaction=True)


def new_file_patch(path: str, lines: int, width: int = 50) -> bytes:
    body = "".join(f"+{f'line {n} of {path}':<{width}}\n" for n in range(lines))
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{lines} @@\n{body}").encode()


BIG = new_file_patch("code/big.txt", 60_000)  # 3 MiB: allowed (under 10 MiB), too big for a page


@pytest.fixture
def big(personas, tmp_path, data_dir):
    """A finished search of project alpha whose cand_001 carries BIG."""
    search = frozen(personas, tmp_path, {"cand_001": 4, "cand_002": 9}, repo_name="repo",
                    population=2, rounds=[2, 1])
    run_inline(personas, search)
    Candidate.objects.filter(search=search, candidate_id="cand_001").update(patch=BIG, diff_lines=60_000)
    return search


def page_url(search, candidate_id: str = "cand_001") -> str:
    return reverse("candidate_detail", args=[search.search_id, candidate_id])


def download_url(search, candidate_id: str = "cand_001") -> str:
    return reverse("candidate_patch", args=[search.search_id, candidate_id])


def test_the_candidate_page_of_a_large_patch_shows_its_first_part_and_links_to_the_whole(big, personas):
    response = login(personas.member).get(page_url(big))
    html = response.content.decode()
    assert response.status_code == 200
    assert len(response.content) < 3 * PAGE_PATCH_MAX_BYTES  # twice the shown part, not twice 3 MiB
    assert 'id="patch-truncated"' in html and "is too large to show in full" in html
    assert "Only the first 10,000 of its 60,005 lines" in html and "50,005 lines" in html
    assert f'href="{download_url(big)}"' in html
    assert "line 9994 of code/big.txt" in html and "line 9995 of code/big.txt" not in html


def test_the_download_is_the_whole_patch_streamed_as_a_diff_attachment(big, personas):
    response = login(personas.member).get(download_url(big))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/x-diff"
    assert response["Content-Disposition"] == f'attachment; filename="{big.search_id}-cand_001.diff"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert b"".join(response.streaming_content) == BIG


def test_the_download_needs_a_login_and_access_to_the_search(big, personas):
    anonymous = Client().get(download_url(big))
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]
    assert login(personas.outsider).get(download_url(big)).status_code == 404
    assert login(personas.member).get(download_url(big, "cand_404")).status_code == 404


def test_the_decision_page_shows_the_same_first_part_and_the_download(big, personas):
    response = login(personas.owner).get(reverse("candidate_decide", args=[big.search_id, "cand_001"]))
    html = response.content.decode()
    # The diff viewer draws it as on the candidate page: the shown part twice (plain text without
    # JavaScript, data for the viewer), never the whole patch.
    assert response.status_code == 200 and len(response.content) < 3 * PAGE_PATCH_MAX_BYTES
    assert 'id="patch-truncated"' in html and f'href="{download_url(big)}"' in html


def test_a_small_patch_is_shown_whole_with_a_download_link_and_no_note(big, personas):
    html = login(personas.member).get(page_url(big, "cand_002")).content.decode()
    assert 'id="patch-truncated"' not in html and "return 9" in html
    assert f'href="{download_url(big, "cand_002")}"' in html


def test_the_compare_page_cuts_a_large_diff_and_links_to_the_whole_diff(big, personas):
    query = "?c=cand_001&c=baseline"
    client = login(personas.member)
    response = client.get(reverse("search_compare", args=[big.search_id]) + query)
    html = response.content.decode()
    assert response.status_code == 200 and len(response.content) < 3 * PAGE_PATCH_MAX_BYTES
    full = reverse("search_compare_diff", args=[big.search_id]) + query.replace("&", "&amp;")
    assert 'id="compare-diff-truncated"' in html and f'href="{full}"' in html
    download = client.get(reverse("search_compare_diff", args=[big.search_id]) + query)
    assert download.status_code == 200 and download["Content-Type"] == "text/x-diff"
    text = b"".join(download.streaming_content)
    assert text.startswith(b"diff --git a/code/big.txt b/code/big.txt\n")
    assert b"-line 59999 of code/big.txt" in text  # the whole diff, back to the baseline
    outsider = login(personas.outsider).get(reverse("search_compare_diff", args=[big.search_id]) + query)
    assert outsider.status_code == 404
    assert client.get(reverse("search_compare_diff", args=[big.search_id]) + "?c=cand_001").status_code == 400


# --- the part shown -----------------------------------------------------------------------------


def test_a_patch_is_cut_after_the_last_whole_file_that_fits():
    text = new_file_patch("a.txt", 10) + new_file_patch("b.txt", 10) + new_file_patch("c.txt", 10)
    shown = patch_shown(text, max_bytes=len(text) - 10)
    assert shown["truncated"] and shown["text"].encode() == text[: text.index(b"diff --git a/c.txt")]
    assert (shown["files"], shown["shown_files"]) == (3, 2)
    assert "Only the first 30 of its 45 lines" in shown["note"] and ", 2 of 3 files)" in shown["note"]


def test_a_first_file_larger_than_the_limit_is_cut_at_a_line():
    text = new_file_patch("a.txt", 1000)
    shown = patch_shown(text, max_lines=100)
    assert shown["shown_lines"] == 100 and shown["text"].endswith("\n")
    assert patch_shown(text, max_bytes=1000)["text"].endswith("\n")
    assert len(patch_shown(text, max_bytes=1000)["text"]) <= 1000


def test_a_patch_within_both_limits_is_shown_whole():
    text = new_file_patch("a.txt", 10)
    shown = patch_shown(text)
    assert not shown["truncated"] and shown["text"].encode() == text
