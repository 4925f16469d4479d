"""In a real browser: type an invalid spec, see line:column errors, jump to one, fix it, freeze."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from runtime_app.services import repository_register
from search_app.models import Search
from tests.e2e.helpers import WAIT_MS, in_worker_thread
from tests.gitrepo import repo_create

pytestmark = pytest.mark.integration
SEED = (Path(__file__).resolve().parent.parent / "search_app" / "specs" / "seed_example.toml").read_text()
TYPO = SEED.replace("trials = 5", "trails = 5").replace("population = 32", "population = 1")
NEW_SEARCH = re.compile(r"^http://127\.0\.0\.1:\d+/searches/specs/new/$")
SEARCH_PAGE = re.compile(r"^http://127\.0\.0\.1:\d+/searches/search-[0-9a-f]{16}/$")


@pytest.fixture
def repository(personas, tmp_path, monkeypatch):
    """A real git repo with one commit, registered for alpha before the browser starts; the
    seed spec's commands can start in it, and its provider has a key (freezing checks)."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", "placeholder-key")
    path = repo_create(tmp_path / "certificate", {
        "code/solve.py": "def solve():\n    return 42\n",
        "certificate.py": "print('ok')\n",
        "scripts/benchmark_candidate.sh": "#!/bin/sh\necho '{\"median_runtime_ms\": 1}'\n",
    }, tags=("v1.0",), executable=("scripts/benchmark_candidate.sh",))
    return repository_register(personas.owner, personas.alpha, str(path), "certificate", trusted=True)


def open_new_search_as_owner(page) -> None:
    page.goto("/searches/specs/new/")
    page.wait_for_url("**/login/?next=/searches/specs/new/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "pw-owner")
    page.click("form button[type=submit]")
    page.wait_for_url(NEW_SEARCH)
    page.wait_for_selector("h1:has-text('New search')")


def offset_of(text: str, line: int, column: int) -> int:
    lines = text.split("\n")
    return sum(len(item) + 1 for item in lines[: line - 1]) + column - 1


def test_an_operator_types_an_invalid_spec_jumps_to_an_error_fixes_it_and_freezes_it(
    personas, repository, browser_page
):
    page = browser_page
    open_new_search_as_owner(page)

    # Picking the repository selects its project and fills the ref with the checked-out branch.
    page.select_option("#id_repository", str(repository.pk))
    page.wait_for_selector("#ref-options option[value='v1.0']", state="attached")
    page.wait_for_function("document.getElementById('id_ref').value === 'main'")
    assert page.input_value("#id_project") == str(personas.alpha.pk)

    page.fill("#spec-text", TYPO)
    error = page.locator("#validation button.spec-error", has_text="score.trails")
    error.wait_for(timeout=WAIT_MS)
    assert error.locator(".where").inner_text() == "32:1"
    assert "did you mean trials?" in error.inner_text()
    assert page.locator("#validation button.spec-error").count() == 4
    assert page.locator("#validation .where", has_text="3:1").count() == 1
    assert page.locator("#spec-gutter span.has-error").count() == 4

    error.click()
    assert page.evaluate("document.activeElement.id") == "spec-text"
    start = page.evaluate("document.getElementById('spec-text').selectionStart")
    assert start == offset_of(TYPO, 32, 1)
    assert TYPO[start:].startswith("trails = 5")
    assert page.inner_text("#cursor-position") == "Line 32, column 1"

    page.fill("#spec-text", SEED)
    page.wait_for_selector("#validation.is-valid", timeout=WAIT_MS)
    assert page.inner_text("#validation .funnel-text") == "32 → 8 → 3 → 1"
    assert "$5.00" in page.inner_text("#validation")
    assert page.locator("#spec-gutter span").count() == SEED.count("\n") + 1

    page.click("#freeze-button")
    page.wait_for_url(SEARCH_PAGE)
    search = in_worker_thread(lambda: Search.objects.get())
    assert page.inner_text("#preregistration-hash") == search.preregistration_hash
    canonical_json = page.inner_text("#canonical-json")
    assert hashlib.sha256(canonical_json.encode()).hexdigest() == search.preregistration_hash
    assert page.url.endswith(f"/searches/{search.search_id}/")
    assert search.ref == "main" and search.repository_id == repository.pk


def test_a_template_fills_the_editor_and_validates_without_a_reload(personas, repository, browser_page):
    page = browser_page
    open_new_search_as_owner(page)
    page.evaluate("window.crucibleSameDocument = true")

    page.click("button[data-template='refactor-with-gates']")
    page.wait_for_selector("#validation.is-valid", timeout=WAIT_MS)
    assert 'name = "refactor-billing"' in page.input_value("#spec-text")
    assert page.inner_text("#validation .funnel-text") == "12 → 4 → 1"
    assert page.evaluate("window.crucibleSameDocument") is True

    # Long texts scroll the gutter with the textarea.
    page.fill("#spec-text", "\n" * 300 + SEED)
    page.evaluate("""() => { const t = document.getElementById('spec-text');
                             t.scrollTop = 2000; t.dispatchEvent(new Event('scroll')); }""")
    page.wait_for_function(
        "document.getElementById('spec-gutter').scrollTop === document.getElementById('spec-text').scrollTop"
    )
    assert page.evaluate("document.getElementById('spec-gutter').scrollTop") > 0
