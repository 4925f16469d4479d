"""Spec and search pages: validate as you type, drafts and versions, diffs, freezing, access."""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

import pytest
from django.test import Client

from runtime_app.models import ProjectMembership
from runtime_app.services import repository_register
from search_app import services
from search_app.models import Search, Spec, SpecVersion
from search_app.spec import RESULTS_WARNING, spec_validate
from search_app.spec_templates import SPEC_TEMPLATES
from tests.gitrepo import git, repo_create
from tests.helpers import login, make_user

pytestmark = pytest.mark.django_db
SEED = (Path(__file__).parent / "specs" / "seed_example.toml").read_text()
METRIC_LINE = 'metric = "median_runtime_ms"'
TYPO = SEED.replace("trials = 5", "trails = 5").replace("population = 32", "population = 1")




def make_repo(root: Path, name: str = "certificate") -> Path:
    files = {"code/solve.py": "def solve():\n    return 42\n", "certificate.py": "print('ok')\n",
             "scripts/benchmark_candidate.sh": "#!/bin/sh\necho '{}'\n",
             "scripts/count_failures.py": "print(0)\n"}
    return repo_create(root / name, files, branches=("feature",), tags=("v1.0",),
                       executable=("scripts/benchmark_candidate.sh",))


@pytest.fixture
def repo_path(tmp_path) -> Path:
    return make_repo(tmp_path)


@pytest.fixture
def repository(personas, repo_path):
    return repository_register(personas.owner, personas.alpha, str(repo_path), "certificate", trusted=True)



def viewer_of_alpha(personas):
    viewer = make_user("watcher")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    return viewer


def page_text(response) -> str:
    return html.unescape(response.content.decode())


# --- validation -----------------------------------------------------------------------------

def test_the_validation_partial_lists_every_error_with_line_column_and_a_suggestion(personas):
    response = login(personas.member).post("/searches/specs/validate/", {"text": TYPO})
    assert response.status_code == 200
    text = page_text(response)
    errors = re.findall(r'data-line="(\d+)" data-column="(\d+)"', response.content.decode())
    assert errors == [(str(e.line), str(e.column)) for e in spec_validate(TYPO).errors]
    assert len(errors) == 4
    assert "3:1" in text and "32:1" in text
    assert "score.trails" in text and "unknown key `trails`" in text
    assert "did you mean" in text and "<code>trials</code>" in response.content.decode()
    assert "expected: a number greater than or equal to 2" in text
    assert 'id="validation"' in response.content.decode()


def test_a_valid_spec_shows_the_summary_card(personas):
    response = login(personas.member).post("/searches/specs/validate/", {"text": SEED})
    text = page_text(response)
    assert "valid" in text and "speed-up-certificate" in text
    assert "32 → 8 → 3 → 1" in text
    assert "32 candidates, admitted in 2 batches of up to 16" in text
    assert "deepseek" in text and "deepseek-v4-flash" in text
    assert "reasoning effort high in every round" in text
    assert "$5.00" in text and "10,000,000 tokens" in text
    assert "PYTHONWARNINGS=error python certificate.py" in text
    assert "minimize" in text and "median_runtime_ms" in text
    assert "the median of its per-block ratios to the baseline, 5 blocks or more" in text
    assert "pareto, diverse" in text
    assert "spec-error" not in text


def test_the_summary_card_says_who_measures_the_score(personas):
    client = login(personas.member)
    reported = page_text(client.post("/searches/specs/validate/", {"text": SEED}))
    assert "reported by the score command, checked against the runtime's wall and CPU time" in reported
    runtime = SEED.replace('metric = "median_runtime_ms"\nreported = "time_ms"',
                           'metric = "runtime:wall_seconds"')
    measured = page_text(client.post("/searches/specs/validate/", {"text": runtime}))
    assert "measured by the runtime, from outside the score command" in measured
    assert "forgeable" not in measured


def test_validation_of_hostile_text_is_escaped(personas):
    text = SEED.replace('objective = "Reduce runtime without changing exact results"',
                        'objective = "<script>alert(1)</script>"')
    content = login(personas.member).post("/searches/specs/validate/", {"text": text}).content.decode()
    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;" in content


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"text=%FF%FE%00name", "not valid TOML"),  # not UTF-8: decoded with replacement characters
        (b"text=" + b"a" * 300_000, "the spec is too large"),
        (b"nothing=here", "Pick a template or start typing"),
        (b"text=%5B%5B%5B", "not valid TOML"),
        (b"text=a+%3D+" + b"%5B" * 5000, "nested too deeply"),
    ],
)
def test_bad_bytes_and_huge_text_get_an_error_list_never_a_500(personas, body, message):
    response = login(personas.member).post(
        "/searches/specs/validate/", body, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 200
    assert message in page_text(response)


def test_validate_refuses_get(personas):
    assert login(personas.member).get("/searches/specs/validate/").status_code == 405


# --- the editor page ----------------------------------------------------------------------------

def test_the_new_search_page_offers_repositories_templates_and_an_editor(personas, repository):
    response = login(personas.owner).get("/searches/specs/new/")
    content = response.content.decode()
    assert response.status_code == 200
    assert f'value="{repository.pk}"' in content and "alpha / certificate" in content
    for template in SPEC_TEMPLATES:
        assert f'data-template="{template.slug}"' in content
    assert 'id="spec-text"' in content and 'id="spec-gutter"' in content
    # Typing, or choosing another repository or baseline, validates again (and checks it there).
    assert ('hx-trigger="input changed delay:400ms, change from:#id_repository, change from:#id_ref"'
            in content)
    assert 'hx-post="/searches/specs/validate/"' in content
    assert 'list="ref-options"' in content


def test_the_template_picker_fills_the_editor_without_javascript(personas):
    response = login(personas.owner).get("/searches/specs/new/?template=bug-fix-with-tests")
    text = page_text(response)
    assert 'name = "fix-date-parsing"' in text
    assert "32 → 8 → 3 → 1" not in text and "8 → 3 → 1" in text
    assert "reasoning effort per round: low → medium → high" in text


@pytest.mark.parametrize("template", SPEC_TEMPLATES, ids=lambda t: t.slug)
def test_every_template_is_a_valid_spec_that_checks_its_trials_results(template):
    report = spec_validate(template.text)
    assert report.valid, [str(error) for error in report.errors]
    assert report.spec.score.results is not None and report.warnings == []


def test_the_speed_up_template_is_the_seeds_example_with_its_results_checked(personas):
    speed_up = spec_validate(SPEC_TEMPLATES[0].text).spec
    seed = spec_validate(SEED).spec
    assert speed_up == seed.model_copy(update={"score": seed.score.model_copy(update={"results": "stdout"})})


def test_choosing_a_repository_preselects_it_and_lists_its_branches_and_tags(personas, repository):
    content = login(personas.owner).get(f"/searches/specs/new/?repository={repository.pk}").content.decode()
    assert f'<option value="{repository.pk}" data-project="{personas.alpha.pk}" selected>' in content
    assert '<option value="feature"' in content and '<option value="v1.0" label="tag">' in content
    assert 'data-default="main"' in content


def test_a_saved_spec_of_a_project_with_one_repository_opens_with_it_and_its_branch(
    personas, repository
):
    spec = services.spec_create(personas.owner, personas.alpha, "speed", SEED)
    content = login(personas.owner).get(f"/searches/specs/{spec.pk}/").content.decode()
    assert f'<option value="{repository.pk}" data-project="{personas.alpha.pk}" selected>' in content
    assert 'name="ref" id="id_ref" value="main"' in content


def test_the_refs_partial_lists_branches_and_tags(personas, repository):
    content = login(personas.member).get(f"/searches/specs/refs/?repository={repository.pk}").content.decode()
    assert 'id="ref-options"' in content
    assert '<option value="main" label="branch (checked out)">' in content
    assert '<option value="v1.0" label="tag">' in content
    empty = login(personas.member).get("/searches/specs/refs/?repository=").content.decode()
    assert "Pick a repository" in empty


def test_a_saved_invalid_spec_shows_its_errors_on_first_load_without_javascript(personas):
    spec = services.spec_create(personas.owner, personas.alpha, "typo", TYPO)
    response = login(personas.member).get(f"/searches/specs/{spec.pk}/")
    text = page_text(response)
    assert response.status_code == 200
    assert "4 problems" in text and "32:1" in text and "did you mean" in text
    assert TYPO.splitlines()[30] in text  # the typed text is in the textarea


# --- drafts, versions, duplicate, diff ------------------------------------------------------------

def test_saving_a_draft_creates_a_spec_and_each_change_a_new_version(personas):
    client = login(personas.owner)
    response = client.post("/searches/specs/new/", {
        "project": personas.alpha.pk, "title": "", "text": TYPO, "action": "save",
    })
    spec = Spec.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/searches/specs/{spec.pk}/"
    assert spec.title == "speed-up-certificate"  # the spec's name when no title is given
    assert [v.valid for v in spec.versions.all()] == [False]

    client.post(f"/searches/specs/{spec.pk}/", {"project": personas.alpha.pk, "text": SEED, "action": "save"})
    client.post(f"/searches/specs/{spec.pk}/", {"project": personas.alpha.pk, "text": SEED, "action": "save"})
    assert [(v.number, v.valid) for v in spec.versions.order_by("number")] == [(1, False), (2, True)]

    page = page_text(client.get(f"/searches/specs/{spec.pk}/"))
    assert "v1" in page and "v2" in page and "diff with v1" in page
    listing = page_text(client.get("/searches/"))
    assert "speed-up-certificate" in listing and "v2" in listing and ">2<" in listing


def test_a_browser_form_post_with_crlf_line_ends_is_stored_with_lf(personas):
    client = login(personas.owner)
    client.post("/searches/specs/new/", {
        "project": personas.alpha.pk, "title": "crlf", "text": SEED.replace("\n", "\r\n"), "action": "save",
    })
    assert SpecVersion.objects.get().text == SEED


def test_an_old_version_opens_in_the_editor(personas):
    spec = services.spec_create(personas.owner, personas.alpha, "two", TYPO)
    services.spec_save(personas.owner, spec, SEED)
    page = page_text(login(personas.owner).get(f"/searches/specs/{spec.pk}/?version=1"))
    assert "Showing v1 (latest is v2)" in page and "trails = 5" in page


def test_duplicate_copies_the_latest_version_into_a_new_spec(personas):
    spec = services.spec_create(personas.owner, personas.alpha, "original", SEED)
    response = login(personas.member).post(f"/searches/specs/{spec.pk}/duplicate/")
    copy = Spec.objects.exclude(pk=spec.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/searches/specs/{copy.pk}/"
    assert copy.title == "original (copy)" and copy.latest.text == SEED
    assert copy.duplicated_from == spec


def test_the_diff_page_shows_added_and_removed_lines_escaped(personas):
    spec = services.spec_create(personas.owner, personas.alpha, "diffed", SEED)
    changed = SEED.replace("trials = 5", "trials = 7").replace(
        'objective = "Reduce runtime without changing exact results"', 'objective = "<b>faster</b>"')
    services.spec_save(personas.owner, spec, changed)
    response = login(personas.member).get(f"/searches/specs/{spec.pk}/diff/?from=1&to=2")
    content = response.content.decode()
    assert response.status_code == 200
    assert '<span class="diff-del">-trials = 5</span>' in content
    assert '<span class="diff-add">+trials = 7</span>' in content
    assert '<span class="diff-file">--- v1</span>' in content
    assert "<b>faster</b>" not in content and "&lt;b&gt;faster&lt;/b&gt;" in content
    # Without parameters: the latest two versions.
    assert "+trials = 7" in login(personas.member).get(f"/searches/specs/{spec.pk}/diff/").content.decode()


def test_a_diff_of_texts_without_a_final_newline_keeps_lines_apart(personas):
    spec = services.spec_create(personas.owner, personas.alpha, "nonl", "a\nb")
    services.spec_save(personas.owner, spec, "a\nc")
    content = login(personas.member).get(f"/searches/specs/{spec.pk}/diff/?from=1&to=2").content.decode()
    assert '<span class="diff-del">-b</span>' in content and '<span class="diff-add">+c</span>' in content


@pytest.mark.parametrize(("query", "status"), [
    ("from=1&to=9", 404), ("from=x&to=1", 400), ("from=0&to=1", 400), ("to=1", 400),
    ("from=99999999999999999999999&to=1", 400),
])
def test_bad_diff_parameters_are_refused_cleanly(personas, query, status):
    spec = services.spec_create(personas.owner, personas.alpha, "diffed", SEED)
    response = login(personas.member).get(f"/searches/specs/{spec.pk}/diff/?{query}")
    assert response.status_code == status


# --- freezing ---------------------------------------------------------------------------------

def freeze_post(client, repository, text=SEED, ref="main", url="/searches/specs/new/"):
    return client.post(url, {
        "project": repository.project_id, "repository": repository.pk, "ref": ref,
        "title": "", "text": text, "action": "freeze",
    })


def test_freezing_redirects_to_the_search_page_with_every_hashed_input(personas, repository, repo_path):
    client = login(personas.owner)
    response = freeze_post(client, repository)
    search = Search.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/searches/{search.search_id}/"
    assert search.spec_version == Spec.objects.get().latest  # the text was saved as a draft too
    assert search.baseline_commit == git(repo_path, "rev-parse", "HEAD")

    page = client.get(response["Location"])
    text = page_text(page)
    canonical_json = search.hashed_inputs["record_canonical_json"]
    assert page.status_code == 200
    assert search.preregistration_hash in text and search.search_id in text
    assert canonical_json in text
    assert hashlib.sha256(canonical_json.encode()).hexdigest() == search.preregistration_hash
    assert search.search_id == "search-" + search.preregistration_hash[:16]
    assert "frozen" in text and search.baseline_commit in text and "main" in text
    assert "deepseek-v4-flash" in text and search.model_resolution in text
    assert search.public_evidence_hash in text and search.evaluator_hash in text
    assert "cand_001" in text and "cand_032" in text and "batch 2" in text
    assert text.count("recomputed ✓") == 3 and "matches ✓" in text
    assert 'ws-connect="/ws/events/search/' in page.content.decode()

    record = client.get(f"/searches/{search.search_id}/record.json")
    assert hashlib.sha256(record.content).hexdigest() == search.preregistration_hash

    listing = page_text(client.get("/searches/"))
    assert search.search_id in listing and search.baseline_commit[:12] in listing and "owner" in listing


def test_the_search_page_lists_evidence_files_and_hidden_evaluator_files_with_their_hashes(
    personas, repository, repo_path
):
    text = SPEC_TEMPLATES[1].text.replace('write_roots = ["src"]', 'write_roots = ["code"]').replace(
        "[evidence]\n", '[evidence]\nfiles = ["code/solve.py"]\n')
    assert spec_validate(text).valid
    response = freeze_post(login(personas.owner), repository, text=text)
    search = Search.objects.get()
    page = page_text(login(personas.member).get(response["Location"]))
    solve_sha = hashlib.sha256((repo_path / "code" / "solve.py").read_bytes()).hexdigest()
    assert "code/solve.py" in page and solve_sha in page
    hidden = search.spec_normalized["evaluator"]["files"]["tests/test_hidden_regression.py"]
    assert "tests/test_hidden_regression.py" in page
    assert hashlib.sha256(hidden.encode()).hexdigest() in page
    assert "parse_date(\"2024-02-29T24:00\") raises ValueError" in page  # the evidence notes
    assert "claude-sonnet-4-5" in page and "cand_008" in page and "batch 2" in page


def test_freezing_an_existing_spec_saves_the_text_as_its_next_version(personas, repository):
    spec = services.spec_create(personas.owner, personas.alpha, "draft", TYPO)
    response = freeze_post(login(personas.owner), repository, url=f"/searches/specs/{spec.pk}/")
    assert response.status_code == 302
    assert Search.objects.get().spec_version == spec.versions.get(number=2)


def test_freezing_with_an_unknown_ref_shows_the_problem_and_keeps_the_text(personas, repository):
    typed = SEED.replace("trials = 5", "trials = 6")
    response = freeze_post(login(personas.owner), repository, text=typed, ref="no-such-branch")
    text = page_text(response)
    assert response.status_code == 400
    assert "Not frozen" in text and "no-such-branch: no branch, tag or commit by that name" in text
    assert "trials = 6" in text and 'value="no-such-branch"' in text
    assert not Search.objects.exists() and not Spec.objects.exists()  # a failed freeze saves nothing


def test_freezing_a_dirty_repository_is_refused(personas, repository, repo_path):
    (repo_path / "certificate.py").write_text("print('changed')\n")
    response = freeze_post(login(personas.owner), repository)
    assert response.status_code == 400
    assert "the baseline is dirty" in page_text(response) and "certificate.py" in page_text(response)
    assert not Search.objects.exists()


def test_freezing_an_invalid_spec_lists_the_spec_errors(personas, repository):
    response = freeze_post(login(personas.owner), repository, text=TYPO)
    assert response.status_code == 400
    assert "spec 32:1 score.trails: unknown key `trails`" in page_text(response)


def test_freezing_without_a_repository_asks_for_one(personas):
    response = login(personas.owner).post("/searches/specs/new/", {
        "project": personas.alpha.pk, "ref": "main", "text": SEED, "action": "freeze"})
    assert response.status_code == 400
    assert "Pick a registered repository." in page_text(response)


def test_a_repository_of_another_project_is_refused(personas, repository, tmp_path):
    other = repository_register(
        personas.outsider, personas.beta, str(make_repo(tmp_path, "other")), trusted=True)
    response = login(personas.owner).post("/searches/specs/new/", {
        "project": personas.alpha.pk, "repository": other.pk, "ref": "main", "text": SEED,
        "action": "freeze"})
    assert response.status_code == 400
    assert not Search.objects.exists()


@pytest.mark.parametrize("data", [
    {"project": "abc", "text": SEED, "action": "save"},
    {"project": "99999999999999999999999999", "text": SEED, "action": "save"},
    {"text": SEED, "action": "save"},
    {"project": "PROJECT", "text": "a\x00b", "action": "save"},
    {"project": "PROJECT", "title": "x" * 500, "text": SEED, "action": "save"},
    {"project": "PROJECT", "text": "x" * 300_000, "action": "save"},
    {"project": "PROJECT", "repository": "x", "text": SEED, "action": "freeze"},
    {"project": "PROJECT", "text": "a = " + "[" * 5000, "action": "freeze"},
])
def test_bad_editor_input_gets_a_400_never_a_500(personas, data):
    data = {key: (personas.alpha.pk if value == "PROJECT" else value) for key, value in data.items()}
    response = login(personas.owner).post("/searches/specs/new/", data)
    assert response.status_code == 400
    assert not Spec.objects.exists()


def test_the_search_page_shows_the_forecast_until_the_search_starts(personas, repository):
    search = services.search_freeze(personas.owner, personas.alpha, SEED, "main", repository=repository)
    client = login(personas.member)
    page = client.get(f"/searches/{search.search_id}/").content.decode()
    # 32 writers; the baseline's 2 gates, 32 to 64 candidates' and 1 to 3 replays'; trials in
    # blocks of every survivor and the baseline (5 blocks, up to 15 when contested), and replays
    # of six blocks each (what decides at 95 %), up to 15 while a replay cannot decide.
    assert 'id="forecast"' in page and 'id="forecast-writers">32<' in page
    assert 'id="forecast-gates">36–72<' in page and 'id="forecast-trials">252–810<' in page
    # deepseek-v4-flash by the price table and the stated assumption, beside the budget.
    assert "<strong>about $1.28</strong> · budget $5.00, 10,000,000 tokens" in page
    assert "Unknown: no finished search of this repository yet." in page
    services.search_start(personas.owner, search, enqueue=False)
    assert 'id="forecast"' not in client.get(f"/searches/{search.search_id}/").content.decode()


def test_the_search_page_warns_when_nothing_checks_correctness_while_the_score_runs(personas, repository):
    unchecked = services.search_freeze(personas.owner, personas.alpha, SEED, "main", repository=repository)
    client = login(personas.member)
    page = page_text(client.get(f"/searches/{unchecked.search_id}/"))
    assert f"Warning: {RESULTS_WARNING}" in page and 'id="spec-warning-1"' in page
    checked = SEED.replace(METRIC_LINE, METRIC_LINE + '\nresults = { stdout = true, files = ["out/r.json"] }')
    search = services.search_freeze(personas.owner, personas.alpha, checked, "main", repository=repository)
    page = page_text(client.get(f"/searches/{search.search_id}/"))
    assert "Warning:" not in page
    assert "each trial's stdout (less its metric lines) and out/r.json compared with the baseline's trial" \
        in " ".join(re.sub(r"<[^>]+>", "", page).split())


def test_the_validation_partial_shows_the_warning_and_what_is_compared(personas):
    client = login(personas.member)
    unchecked = page_text(client.post("/searches/specs/validate/", {"text": SEED}))
    assert f"Warning: {RESULTS_WARNING}" in unchecked and "not compared" in unchecked
    checked = SEED.replace(METRIC_LINE, METRIC_LINE + '\nresults = "stdout"')
    shown = page_text(client.post("/searches/specs/validate/", {"text": checked}))
    assert "Warning:" not in shown and "stdout (less its metric lines)" in shown


# --- access -----------------------------------------------------------------------------------

def test_an_outsider_gets_404_for_another_teams_specs_searches_and_repositories(personas, repository):
    spec = services.spec_create(personas.owner, personas.alpha, "secret", SEED)
    search = services.search_freeze(personas.owner, personas.alpha, SEED, "main", repository=repository)
    client = login(personas.outsider)
    for url in [f"/searches/specs/{spec.pk}/", f"/searches/specs/{spec.pk}/diff/",
                f"/searches/{search.search_id}/", f"/searches/{search.search_id}/record.json",
                f"/searches/specs/refs/?repository={repository.pk}", "/searches/specs/refs/?repository=x",
                "/searches/specs/99999999999999999999999/", "/searches/no-such-search/"]:
        assert client.get(url).status_code == 404, url
    assert client.post(f"/searches/specs/{spec.pk}/", {"text": SEED, "action": "save"}).status_code == 404
    assert client.post(f"/searches/specs/{spec.pk}/duplicate/").status_code == 404
    listing = page_text(client.get("/searches/"))
    assert "secret" not in listing and search.search_id not in listing
    assert "alpha / certificate" not in page_text(client.get("/searches/specs/new/"))


def test_a_viewer_reads_and_validates_but_gets_403_on_every_write(personas, repository):
    spec = services.spec_create(personas.owner, personas.alpha, "draft", SEED)
    client = login(viewer_of_alpha(personas))
    assert client.get(f"/searches/specs/{spec.pk}/").status_code == 200
    assert client.post("/searches/specs/validate/", {"text": SEED}).status_code == 200
    assert "New search" not in page_text(client.get("/searches/"))
    assert "operators save drafts and freeze" in page_text(client.get("/searches/specs/new/"))
    base = {"project": personas.alpha.pk, "repository": repository.pk, "ref": "main", "text": SEED}
    assert client.post("/searches/specs/new/", {**base, "action": "save"}).status_code == 403
    assert client.post("/searches/specs/new/", {**base, "action": "freeze"}).status_code == 403
    edit = f"/searches/specs/{spec.pk}/"
    assert client.post(edit, {**base, "text": TYPO, "action": "save"}).status_code == 403
    assert client.post(f"/searches/specs/{spec.pk}/", {**base, "action": "freeze"}).status_code == 403
    assert client.post(f"/searches/specs/{spec.pk}/duplicate/").status_code == 403
    assert Spec.objects.count() == 1 and spec.versions.count() == 1 and not Search.objects.exists()


def test_posts_without_a_csrf_token_are_refused(personas, repository):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.owner)
    assert client.post("/searches/specs/validate/", {"text": SEED}).status_code == 403
    assert freeze_post(client, repository).status_code == 403
    assert not Spec.objects.exists()


def test_htmx_validation_with_the_csrf_header_is_accepted(personas):
    client = Client(enforce_csrf_checks=True)
    client.force_login(personas.owner)
    page = client.get("/searches/specs/new/").content.decode()
    token = re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)
    response = client.post("/searches/specs/validate/", {"text": SEED},
                           HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "32 → 8 → 3 → 1" in page_text(response)
