"""Freezing: golden hashes, determinism, sensitivity to every input, and bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from runtime_app.fleet import PRESETS
from runtime_app.models import AuditEntry, Event, ProjectMembership
from runtime_app.services import repository_register
from search_app.freeze import (
    FreezeError,
    candidate_batches,
    canonical,
    evaluator_record,
    freeze_inputs,
    preregistration_record,
    search_id_for,
    sha256_hex,
)
from search_app.models import Search
from search_app.services import search_freeze
from search_app.spec import spec_normalized, spec_validate
from tests.gitrepo import BASELINE_FILES, baseline_repo, git, seed_runnable, write_files
from tests.helpers import make_user

SEED = (Path(__file__).parent / "specs" / "seed_example.toml").read_text()
EVIDENCE = '\n[evidence]\nfiles = ["docs/notes.md"]\ntext = "Results must stay byte-identical."\n'
HIDDEN = '\n[evaluator.files]\n"tests/test_hidden.py" = "def test_hidden():\\n    assert True\\n"\n'
WITH_EVIDENCE = SEED + EVIDENCE
FULL = SEED + EVIDENCE + HIDDEN

# Golden values: the seed spec (plus an evidence file) frozen at the fixture's `v1` commit.
# They change only when the canonical encoding, the normalized spec or the fixture changes —
# and then every frozen search would get a new id, so update them deliberately.
GOLDEN_BASELINE_COMMIT = "6d8d2e79a0eb21309284c06bdf9eb139944baf98"
GOLDEN_MAIN_COMMIT = "9ab8b32df91bb2a0be1036ab686d0abedfcb4c82"
GOLDEN_EVIDENCE_HASH = "bb3391dcc45f59fd3f400614043081de4a63392a4bb2f7be77fbbbfb82ef630c"
GOLDEN_EVALUATOR_HASH = "bcf6f96f8321ac2e7112d72157a25c41ed027f6cb36c9b6d871fc4658e0cbd67"
GOLDEN_PREREGISTRATION_HASH = "ab6b63a15ce8407cbb648919b1ea9b660b55d8bea6ad35dd8e7e3705ee5c36b5"
GOLDEN_SEARCH_ID = "search-ab6b63a15ce8407c"
# The seed as the seed document gives it (no evidence), with the `reported` line issue 30 asks for.
GOLDEN_SEED_EVIDENCE_HASH = "a9c449ae5342cd28cfe2d374e22e4434410971c9c32801c334d971ac318fc570"
GOLDEN_SEED_PREREGISTRATION_HASH = "2bce7cba4bdbc2eae505472312b7b4fe878540db1346a6a733e3cd848875bc0c"
GOLDEN_SEED_SEARCH_ID = "search-2bce7cba4bdbc2ea"


@pytest.fixture
def repo(tmp_path) -> Path:
    return baseline_repo(tmp_path / "certificate")


def freeze(text: str, repo: Path, ref: str = "v1"):
    return freeze_inputs(text, str(repo), ref)


def problems_of(text: str, path: str | Path, ref: str = "v1") -> list[str]:
    with pytest.raises(FreezeError) as caught:
        freeze_inputs(text, str(path), ref)
    return caught.value.problems


# --- golden values and determinism ----------------------------------------------------------


def test_the_fixture_repository_has_the_same_commits_on_every_machine(repo):
    assert git(repo, "rev-parse", "v1") == GOLDEN_BASELINE_COMMIT
    assert git(repo, "rev-parse", "main") == GOLDEN_MAIN_COMMIT


def test_the_seed_spec_with_an_evidence_file_freezes_to_the_golden_values(repo):
    frozen = freeze(WITH_EVIDENCE, repo)
    assert frozen.baseline_commit == GOLDEN_BASELINE_COMMIT
    assert (frozen.requested_model_id, frozen.resolved_model_id) == ("deepseek-v4-flash", "deepseek-v4-flash")
    assert frozen.model_resolution == "requested_as_pinned"
    assert frozen.public_evidence_hash == GOLDEN_EVIDENCE_HASH
    assert frozen.evaluator_hash == GOLDEN_EVALUATOR_HASH
    assert frozen.preregistration_hash == GOLDEN_PREREGISTRATION_HASH
    assert frozen.search_id == GOLDEN_SEARCH_ID


def test_the_seed_spec_as_written_freezes_to_its_golden_values(repo):
    frozen = freeze(SEED, repo)
    assert frozen.public_evidence_hash == GOLDEN_SEED_EVIDENCE_HASH
    assert frozen.evaluator_hash == GOLDEN_EVALUATOR_HASH
    assert frozen.preregistration_hash == GOLDEN_SEED_PREREGISTRATION_HASH
    assert frozen.search_id == GOLDEN_SEED_SEARCH_ID


def test_freezing_twice_gives_the_same_ids(repo):
    first, second = freeze(FULL, repo), freeze(FULL, repo)
    assert (first.preregistration_hash, first.search_id) == (second.preregistration_hash, second.search_id)
    assert first.record == second.record


def test_a_clone_at_another_path_gives_the_same_ids(repo, tmp_path):
    clone = tmp_path / "elsewhere" / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, capture_output=True)
    assert freeze(FULL, clone).search_id == freeze(FULL, repo).search_id


def test_comments_key_order_and_written_out_defaults_do_not_change_the_ids(repo):
    lines = SEED.split("\n")
    reordered = "\n".join([lines[2], lines[1], lines[0], *lines[3:]])  # population, objective, name
    rewritten = "# the certificate search\nschema_version = 1\n" + reordered.replace(
        "trials = 5", "trials = 5  # median of five\ntimeout_seconds = 900"
    ) + EVIDENCE
    assert freeze(rewritten, repo).search_id == freeze(WITH_EVIDENCE, repo).search_id


def test_every_hashed_input_is_recorded_so_a_reviewer_can_recompute_both_hashes(repo):
    frozen = freeze(FULL, repo)
    shown = frozen.hashed_inputs()
    record = shown["record"]
    assert hashlib.sha256(shown["record_canonical_json"].encode()).hexdigest() == frozen.preregistration_hash
    assert sha256_hex(canonical(record)) == frozen.preregistration_hash
    assert search_id_for(frozen.preregistration_hash) == frozen.search_id
    assert frozen.search_id == "search-" + frozen.preregistration_hash[:16]
    assert sha256_hex(canonical(shown["evidence"])) == record["public_evidence_hash"]
    assert sha256_hex(canonical(shown["evaluator"])) == record["evaluator_hash"] == frozen.evaluator_hash
    assert record["public_evidence_hash"] == frozen.public_evidence_hash
    notes = hashlib.sha256(BASELINE_FILES["docs/notes.md"].encode()).hexdigest()
    assert shown["evidence"]["files"] == [{"path": "docs/notes.md", "sha256": notes}]
    hidden = b"def test_hidden():\n    assert True\n"
    assert shown["evaluator"]["hidden_files"] == [
        {"path": "tests/test_hidden.py", "sha256": hashlib.sha256(hidden).hexdigest()}
    ]
    assert record["spec"] == spec_normalized(spec_validate(FULL).spec)
    assert set(record) == {"format", "baseline_commit", "requested_model_id", "resolved_model_id",
                           "public_evidence_hash", "evaluator_hash", "spec"}


# --- sensitivity: any change to any input changes the ids -----------------------------------------


def test_another_baseline_commit_changes_the_ids(repo):
    at_v1, at_main = freeze(FULL, repo, "v1"), freeze(FULL, repo, "main")
    assert at_main.baseline_commit == GOLDEN_MAIN_COMMIT
    assert at_main.public_evidence_hash == at_v1.public_evidence_hash  # docs/notes.md is unchanged
    assert at_main.evaluator_hash == at_v1.evaluator_hash
    assert at_main.preregistration_hash != at_v1.preregistration_hash
    assert at_main.search_id != at_v1.search_id


def test_changed_evidence_file_content_changes_the_evidence_hash_and_the_ids(repo):
    before = freeze(FULL, repo, "main")
    write_files(repo, {"docs/notes.md": "The certificate must match to the last digit.\n"})
    git(repo, "commit", "-q", "-am", "sharper notes")
    after = freeze(FULL, repo, "main")
    assert after.public_evidence_hash != before.public_evidence_hash
    assert after.evaluator_hash == before.evaluator_hash
    assert after.search_id != before.search_id


def test_a_differently_resolved_model_changes_the_ids(repo, monkeypatch):
    before = freeze(FULL, repo)
    pinned = {"deepseek-v4-flash": "deepseek-v4-flash-2026-12-01"}
    monkeypatch.setitem(PRESETS, "deepseek", dataclasses.replace(PRESETS["deepseek"], pinned_models=pinned))
    after = freeze(FULL, repo)
    assert after.requested_model_id == before.requested_model_id == "deepseek-v4-flash"
    assert after.resolved_model_id == "deepseek-v4-flash-2026-12-01"
    assert after.model_resolution == "preset_pinned"
    assert after.record["spec"] == before.record["spec"]
    assert after.preregistration_hash != before.preregistration_hash
    assert after.search_id != before.search_id


RECORD_FIELDS = {
    "baseline_commit": GOLDEN_BASELINE_COMMIT,
    "requested_model_id": "deepseek-v4-flash",
    "resolved_model_id": "deepseek-v4-flash",
    "public_evidence_hash": GOLDEN_EVIDENCE_HASH,
    "evaluator_hash": GOLDEN_EVALUATOR_HASH,
    "spec": spec_normalized(spec_validate(WITH_EVIDENCE).spec),
}


def test_the_record_fields_rebuild_the_golden_preregistration_hash():
    assert sha256_hex(canonical(preregistration_record(**RECORD_FIELDS))) == GOLDEN_PREREGISTRATION_HASH


@pytest.mark.parametrize("field", sorted(RECORD_FIELDS))
def test_each_field_of_the_record_changes_the_hash_on_its_own(field):
    changed = dict(RECORD_FIELDS)
    if field == "spec":
        changed["spec"] = {**RECORD_FIELDS["spec"], "objective": "Reduce runtime."}
    else:
        changed[field] = RECORD_FIELDS[field][:-1] + ("0" if RECORD_FIELDS[field][-1] != "0" else "1")
    assert sha256_hex(canonical(preregistration_record(**changed))) != GOLDEN_PREREGISTRATION_HASH


# (key path in the normalized spec, text to replace, replacement, hashes that change besides the id)
SPEC_CHANGES = [
    ("name", 'name = "speed-up-certificate"', 'name = "speed-up-certificate-2"', set()),
    ("objective", 'results"', 'results, on every input"', set()),
    ("population", "population = 32\nrounds = [32,", "population = 33\nrounds = [33,", set()),
    ("rounds", "rounds = [32, 8, 3, 1]", "rounds = [32, 8, 1]", set()),
    ("concurrency", "concurrency = 16", "concurrency = 8", set()),
    ("worker.provider", 'provider = "deepseek"', 'provider = "openai"', set()),
    ("worker.model", 'model = "deepseek-v4-flash"', 'model = "deepseek-v4-pro"', {"requested"}),
    ("worker.reasoning_effort", 'reasoning_effort = "high"',
     'reasoning_effort = ["low", "low", "high", "max"]', set()),
    ("worker.write_roots", 'write_roots = ["code"]', 'write_roots = ["code", "lib"]', set()),
    ("worker.exact_files", 'write_roots = ["code"]', 'write_roots = ["code"]\nexact_files = ["README.md"]',
     set()),
    ("worker.command", 'write_roots = ["code"]', 'write_roots = ["code"]\ncommand = "unused-agent"', set()),
    ("budget.max_cost_microusd", "max_cost_microusd = 5000000", "max_cost_microusd = 5000001", set()),
    ("budget.max_tokens", "max_tokens = 10000000", "max_tokens = 9999999", set()),
    ("evidence.files", 'files = ["docs/notes.md"]', 'files = ["docs/notes.md", "README.md"]', {"evidence"}),
    ("evidence.text", "byte-identical.", "byte-identical!", {"evidence"}),
    ("evaluator.files", "assert True", "assert 1 == 1", {"evaluator"}),
    ("hard_gates.commands", "PYTHONWARNINGS=error python", "PYTHONWARNINGS=default python", {"evaluator"}),
    ("hard_gates.protected_paths", 'protected_paths = ["tests", ', 'protected_paths = ["tests", "code/x", ',
     set()),
    ("hard_gates.timeout_seconds", "forbid_test_changes = true",
     "forbid_test_changes = true\ntimeout_seconds = 601", {"evaluator"}),
    ("score.command", "./scripts/benchmark_candidate.sh", "./scripts/benchmark.sh", {"evaluator"}),
    ("score.metric", 'metric = "median_runtime_ms"', 'metric = "median_runtime_us"', {"evaluator"}),
    ("score.direction", 'direction = "minimize"\nmetric = "median_runtime_ms"\nreported = "time_ms"',
     'direction = "maximize"\nmetric = "median_runtime_ms"\nreported = "other"', {"evaluator"}),
    ("score.reported", 'reported = "time_ms"', 'reported = "time_us"', {"evaluator"}),
    ("score.trials", "trials = 5", "trials = 7", {"evaluator"}),
    ("score.timeout_seconds", "trials = 5", "trials = 5\ntimeout_seconds = 901", {"evaluator"}),
    ("score.tie_breakers", 'tie_breakers = ["diff_lines", "cost_microusd"]',
     'tie_breakers = ["cost_microusd", "diff_lines"]', set()),
    ("selection.policy", 'policy = "pareto"', 'policy = "ordered"', set()),
    ("selection.ordering", 'policy = "pareto"', 'policy = "pareto"\nordering = ["score", "cost_microusd"]',
     set()),
    ("selection.retain_diversity", "retain_diversity = true", "retain_diversity = false", set()),
]
# Keys with a single allowed value cannot change, so they cannot change an id.
SINGLE_VALUED = {
    "schema_version", "integration_policy", "worker.write_authority", "hard_gates.forbid_test_changes"
}


def leaf_paths(data: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and key != "files":
            paths |= leaf_paths(value, path + ".")
        else:
            paths.add(path)
    return paths


def test_the_sensitivity_table_changes_every_key_of_the_normalized_spec():
    normalized = spec_normalized(spec_validate(FULL).spec)
    assert {path for path, *_ in SPEC_CHANGES} | SINGLE_VALUED == leaf_paths(normalized)


@pytest.mark.parametrize(("key", "old", "new", "also"), SPEC_CHANGES, ids=[c[0] for c in SPEC_CHANGES])
def test_changing_a_spec_key_changes_the_ids(repo, key, old, new, also):
    base = freeze(FULL, repo)
    assert old in FULL
    changed = freeze(FULL.replace(old, new, 1), repo)
    assert changed.record["spec"] != base.record["spec"]
    assert changed.preregistration_hash != base.preregistration_hash
    assert changed.search_id != base.search_id
    assert (changed.evaluator_hash != base.evaluator_hash) == ("evaluator" in also)
    assert (changed.public_evidence_hash != base.public_evidence_hash) == ("evidence" in also)
    assert (changed.requested_model_id != base.requested_model_id) == ("requested" in also)
    assert changed.baseline_commit == base.baseline_commit


@pytest.mark.parametrize("after, section, key, default, other, other_value", [
    ('write_roots = ["code"]', "worker", "refine", "false", "true", True),
    ('metric = "median_runtime_ms"', "score", "replay_tolerance", "0.25", "0.5", 0.5),
    ('write_roots = ["code"]', "worker", "max_patch_bytes", "10485760", "1048576", 1048576),
    ('write_roots = ["code"]', "worker", "max_patch_files", "1000", "50", 50),
])
def test_a_key_added_later_keeps_the_ids_a_spec_always_had_at_its_default_and_changes_them_otherwise(
    repo, after, section, key, default, other, other_value
):
    base = freeze(WITH_EVIDENCE, repo)
    assert base.search_id == GOLDEN_SEARCH_ID
    written_out = freeze(WITH_EVIDENCE.replace(after, f"{after}\n{key} = {default}", 1), repo)
    assert written_out.search_id == base.search_id and key not in written_out.record["spec"][section]
    changed = freeze(WITH_EVIDENCE.replace(after, f"{after}\n{key} = {other}", 1), repo)
    assert changed.search_id != base.search_id and changed.record["spec"][section][key] == other_value


# --- bad input ----------------------------------------------------------------------------------


def test_a_path_that_is_not_a_git_repository_is_refused(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "file.txt").write_text("x")
    assert problems_of(SEED, plain) == [f"{plain}: not a git repository (no .git here)"]


def test_a_path_that_does_not_exist_is_refused(tmp_path):
    assert problems_of(SEED, tmp_path / "missing") == [f"{tmp_path / 'missing'}: no such directory"]


def test_a_relative_path_is_refused():
    assert problems_of(SEED, "certificate") == ["certificate: give an absolute path"]


def test_a_file_instead_of_a_directory_is_refused(repo):
    readme = repo / "README.md"
    assert problems_of(SEED, readme) == [f"{readme}: not a directory"]


def test_a_subdirectory_of_a_repository_is_not_the_repository(repo):
    assert problems_of(SEED, repo / "code") == [f"{repo / 'code'}: not a git repository (no .git here)"]


def test_a_bare_repository_is_refused(tmp_path):
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    assert problems_of(SEED, bare) == [f"{bare}: a bare repository; register a clone with a working tree"]


def test_an_unknown_ref_is_refused_by_name(repo):
    assert problems_of(SEED, repo, "release-9") == ["release-9: no branch, tag or commit by that name"]


def test_an_empty_ref_is_refused(repo):
    assert problems_of(SEED, repo, "  ") == ["give a ref: a branch, a tag, HEAD or a commit sha"]


def test_head_of_an_empty_repository_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    assert problems_of(SEED, empty, "HEAD") == ["HEAD: the repository has no commits yet"]
    assert problems_of(SEED, empty, "main") == ["main: no branch, tag or commit by that name"]


def test_a_dirty_baseline_is_refused_naming_the_changed_file(repo):
    (repo / "code" / "certificate.py").write_text("print('edited')\n")
    [problem] = problems_of(SEED, repo)
    assert problem == (
        f"{repo}: the baseline is dirty — uncommitted changes to code/certificate.py; "
        "commit or stash them first"
    )


def test_a_staged_change_is_dirty_too_but_an_untracked_file_is_not(repo):
    (repo / "scratch.txt").write_text("notes")
    assert freeze(SEED, repo).baseline_commit == GOLDEN_BASELINE_COMMIT
    (repo / "README.md").write_text("changed\n")
    git(repo, "add", "README.md")
    [problem] = problems_of(SEED, repo)
    assert "uncommitted changes to README.md" in problem


def test_a_missing_evidence_file_is_refused_by_name(repo):
    text = SEED + '\n[evidence]\nfiles = ["docs/notes.md", "docs/missing.md"]\n'
    assert problems_of(text, repo) == ["evidence.files: docs/missing.md: no such file at 6d8d2e79a0eb"]


def test_an_evidence_path_that_is_a_directory_is_refused(repo):
    text = SEED + '\n[evidence]\nfiles = ["docs"]\n'
    assert problems_of(text, repo) == ["evidence.files: docs: a directory; list its files at 6d8d2e79a0eb"]


def test_an_evidence_path_below_a_file_is_a_missing_file(repo):
    text = SEED + '\n[evidence]\nfiles = ["README.md/notes"]\n'
    assert problems_of(text, repo) == ["evidence.files: README.md/notes: no such file at 6d8d2e79a0eb"]


def test_evidence_is_read_at_the_baseline_not_from_the_working_tree(repo):
    (repo / "docs" / "later.md").write_text("untracked, so not at the baseline\n")
    text = SEED + '\n[evidence]\nfiles = ["docs/later.md"]\n'
    assert problems_of(text, repo) == ["evidence.files: docs/later.md: no such file at 6d8d2e79a0eb"]


def test_every_problem_is_reported_at_once(repo):
    (repo / "README.md").write_text("dirty\n")
    text = SEED + '\n[evidence]\nfiles = ["docs", "nope.md"]\n'
    problems = problems_of(text, repo)
    assert len(problems) == 3
    assert "the baseline is dirty" in problems[0]
    assert problems[1:] == [
        "evidence.files: docs: a directory; list its files at 6d8d2e79a0eb",
        "evidence.files: nope.md: no such file at 6d8d2e79a0eb",
    ]


def test_an_invalid_spec_is_refused_with_its_errors_before_the_repository_is_read(tmp_path):
    text = SEED.replace("trials = 5", "trials = 0")
    assert problems_of(text, tmp_path / "missing") == [
        "spec 32:1 score.trials: invalid value; expected a number greater than or equal to 1"
    ]


# --- candidates ----------------------------------------------------------------------------


def test_the_seed_admits_cand_001_to_cand_032_in_two_batches_of_16(repo):
    batches = freeze(SEED, repo).candidate_batches
    assert [len(batch) for batch in batches] == [16, 16]
    assert batches[0][:3] == ["cand_001", "cand_002", "cand_003"]
    assert batches[1][-1] == "cand_032"


def test_candidate_batches_hold_concurrency_ids_and_the_rest_last():
    assert candidate_batches(5, 2) == [["cand_001", "cand_002"], ["cand_003", "cand_004"], ["cand_005"]]
    assert candidate_batches(2, 1) == [["cand_001"], ["cand_002"]]


def test_a_population_of_1000_pads_every_id_to_four_digits_so_they_sort():
    batches = candidate_batches(1000, 16)
    ids = [cid for batch in batches for cid in batch]
    assert (ids[0], ids[-1], len(ids), len(batches)) == ("cand_0001", "cand_1000", 1000, 63)
    assert ids == sorted(ids)


# --- the search_freeze service --------------------------------------------------------------


@pytest.mark.django_db
def test_search_freeze_records_an_immutable_search_with_an_event_and_an_audit_entry(personas, repo):
    # The seed's own commands cannot start in this fixture's tree, so freezing refuses it as written
    # (tests/search_app/test_preflight.py); its golden ids are freeze_inputs' above.
    text = seed_runnable(WITH_EVIDENCE)
    expected = freeze(text, repo)
    search = search_freeze(personas.member, personas.alpha, text, "v1", repository_path=str(repo))
    assert search.search_id == expected.search_id
    assert search.preregistration_hash == expected.preregistration_hash
    assert search.baseline_commit == GOLDEN_BASELINE_COMMIT
    assert search.public_evidence_hash == GOLDEN_EVIDENCE_HASH
    assert search.evaluator_hash == expected.evaluator_hash
    assert search.spec_text == text
    assert search.candidate_batches[0][0] == "cand_001"
    stored = Search.objects.get(pk=search.pk)
    assert sha256_hex(canonical(stored.hashed_inputs["record"])) == stored.preregistration_hash
    event = Event.objects.get(kind="search.frozen")
    assert (event.project, event.subject_type, event.subject_id) == (personas.alpha, "search", search.pk)
    audit = AuditEntry.objects.get(action="search.freeze")
    assert (audit.actor, audit.project, audit.detail["preregistration_hash"]) == (
        personas.member, personas.alpha, expected.preregistration_hash
    )
    stored.name = "renamed"
    with pytest.raises(ValueError, match="immutable"):
        stored.save()
    assert Search.objects.get(pk=search.pk).name == "speed-up-certificate"


@pytest.mark.django_db
def test_search_freeze_twice_returns_the_same_search(personas, repo):
    registered = repository_register(personas.owner, personas.alpha, str(repo), trusted=True)
    text = seed_runnable(FULL)
    first = search_freeze(personas.owner, personas.alpha, text, "v1", repository=registered)
    by_sha = GOLDEN_BASELINE_COMMIT  # the same commit by another name is the same search
    second = search_freeze(personas.member, personas.alpha, text, by_sha, repository=registered)
    assert second.pk == first.pk
    assert Search.objects.count() == 1
    assert Event.objects.filter(kind="search.frozen").count() == 1
    assert AuditEntry.objects.filter(action="search.freeze").count() == 1


@pytest.mark.django_db
def test_search_freeze_refuses_a_viewer(personas, repo):
    viewer = make_user("viewer")
    ProjectMembership.objects.create(project=personas.alpha, user=viewer)
    with pytest.raises(PermissionDenied):
        search_freeze(viewer, personas.alpha, SEED, "v1", repository_path=str(repo))
    assert not Search.objects.exists()


@pytest.mark.django_db
def test_search_freeze_refuses_an_operator_who_is_not_a_member(personas, repo):
    with pytest.raises(PermissionDenied):
        search_freeze(personas.outsider, personas.alpha, SEED, "v1", repository_path=str(repo))
    assert not Search.objects.exists()


@pytest.mark.django_db
def test_search_freeze_reports_freeze_problems_as_a_validation_error(personas, repo):
    (repo / "README.md").write_text("dirty\n")
    with pytest.raises(ValidationError) as caught:
        search_freeze(personas.member, personas.alpha, SEED, "v1", repository_path=str(repo))
    assert "the baseline is dirty" in caught.value.messages[0]
    assert not Search.objects.exists()
    assert not Event.objects.filter(kind="search.frozen").exists()


@pytest.mark.django_db
def test_search_freeze_refuses_a_repository_of_another_project(personas, repo, tmp_path):
    other = shutil.copytree(repo, tmp_path / "other-copy", symlinks=True)
    theirs = repository_register(personas.outsider, personas.beta, str(other), trusted=True)
    with pytest.raises(ValidationError, match="another project"):
        search_freeze(personas.member, personas.alpha, SEED, "v1", repository=theirs)


def test_the_results_a_trial_is_checked_on_are_part_of_the_evaluator_record_only_when_declared():
    assert "results" not in evaluator_record(spec_validate(SEED).spec)["score"]
    results = 'results = { files = ["out/r.txt"], tolerance = 0.01 }'
    checked = SEED.replace('metric = "median_runtime_ms"', f'metric = "median_runtime_ms"\n{results}')
    record = evaluator_record(spec_validate(checked).spec)
    assert record["score"]["results"] == {"stdout": False, "files": ["out/r.txt"], "tolerance": 0.01}
