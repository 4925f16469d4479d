"""A full search whose writers are LLM workers: the real anthropic SDK against the loopback fake."""

from __future__ import annotations

import json
import logging

import pytest

from runtime_app.models import Event, Receipt
from search_app import services
from tests.fakes.anthropic_server import FakeAnthropic
from tests.helpers import REPO_ROOT, login
from tests.search_app.runs import plan_repo, spec_text

pytestmark = pytest.mark.django_db(transaction=True)
KEY = "sk-ant-test-secret-0123456789"


def llm_spec(**options) -> str:
    text = spec_text(**options)
    return text.replace('provider = "command"\ncommand = "python scripts/writer.py"',
                        'provider = "anthropic"\nmodel = "fake-sonnet"')


def answer(value: int) -> dict[str, str]:
    return {"path": "code/answer.py", "content": f"def answer():\n    return {value}\n"}


@pytest.fixture
def fake(monkeypatch, tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    plan = {"cand_001": answer(5), "cand_002": answer(9), "cand_003": {"path": "tests/test_answer.py",
                                                                        "content": "x = 1\n"}}
    with FakeAnthropic(plan=plan) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        yield server


def test_llm_writers_edit_through_the_tool_loop_and_the_best_wins(personas, tmp_path, fake, caplog):
    caplog.set_level(logging.DEBUG)
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha, llm_spec(population=4, rounds=[4, 1]),
                                    "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    fate = {c.candidate_id: c for c in search.candidates.all()}
    # cand_003's model tried to edit the tests: the editor refused and told it why.
    refusals = [block for request in fake.requests for message in request["messages"]
                if isinstance(message["content"], list) for block in message["content"]
                if block.get("type") == "tool_result" and block.get("is_error")]
    assert len(refusals) == 1 and "outside the paths you may change (code)" in refusals[0]["content"]
    assert fate["cand_003"].state == "eliminated" and "changed nothing" in fate["cand_003"].reason
    assert "changed nothing" in fate["cand_004"].reason  # the model had no plan: it only talked
    calls = Receipt.objects.filter(kind="llm_call", subject_type="candidate", label__contains="writer")
    assert calls.count() == 7  # two turns each for three edits, one for cand_004
    review = search.reviews.get()
    assert review.verdict == "approve" and review.reviewer == "anthropic fake-sonnet (read-only tools)"
    reviewer_calls = Receipt.objects.filter(kind="llm_call", label__contains="reviewer")
    assert reviewer_calls.count() == 1
    # The model reviewer is told the whole class of reaching into the judge, and to name the line.
    told = str([r["system"] for r in fake.requests if "independent reviewer" in str(r["system"])])
    for category in ("test-runner internals", "pluginmanager", "pytest_*", "sys.settrace", "sys.addaudithook",
                     "gc", "sys._getframe", "f_back", "sys.modules", "__subclasses__", "os._exit", "atexit",
                     "signal.signal", "time.perf_counter = ...", "builtins.print", "sys.stdout",
                     "sys.argv", "sys.flags", "os.environ", "os.getcwd", "/proc", "__import__",
                     "reject, and name the line"):
        assert category in told, category
    assert {c.resolved_model for c in calls} == {"fake-sonnet-20261201"}
    from search_app.selectors import search_run_report

    llm = search_run_report(search)["llm"]
    assert llm["calls"] == 8 and 0.5 < llm["cache_hit_ratio"] < 1
    assert llm["cache_hit_ratio"] == round(llm["cache_read_tokens"] / (
        llm["input_tokens"] + llm["cache_read_tokens"] + llm["cache_write_tokens"]), 4)

    card = login(personas.owner).get(f"/searches/{search.search_id}/run/").content.decode()
    assert f"cache hit ratio {llm['cache_hit_ratio']:.3f}" in card
    all_calls = Receipt.objects.filter(kind="llm_call")
    assert run.spent_cost_microusd == sum(c.cost_microusd for c in all_calls) > 0
    assert fate["cand_002"].cost_microusd > 0 and fate["cand_002"].tokens > 0
    # The shared prefix is byte-identical for every candidate, so all but the first read the cache.
    first_turns = [request for request in fake.requests
                   if len(request["messages"]) == 1 and "# Crucible search" in str(request["system"])]
    assert len(first_turns) == 4
    assert len({json.dumps(r["system"]) for r in first_turns}) == 1
    assert sum(1 for c in calls if c.cache_read_tokens) >= 6
    # The key reached the provider only: no receipt, event or log line carries it.
    assert fake.keys_seen() == {KEY}
    assert KEY not in json.dumps([r.as_dict() for r in Receipt.objects.all()])
    assert KEY not in json.dumps(list(Event.objects.values("payload")))
    assert KEY not in caplog.text


def test_a_provider_that_keeps_failing_fails_the_candidate_not_the_search(personas, tmp_path, fake):
    fake.fail_next(*[("529", 0)] * 6)
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha,
                                    llm_spec(population=2, rounds=[2, 1], concurrency=1),
                                    "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    assert "changed nothing" in search.candidates.get(candidate_id="cand_001").reason
    failed = Receipt.objects.get(kind="llm_call", error__contains="529")
    assert failed.label == "cand_001 writer call 1"


def test_the_budget_reservation_stops_a_writer_before_it_could_overspend(personas, tmp_path, fake):
    repo = plan_repo(tmp_path / "repo", {})
    budget = "[budget]\nmax_cost_microusd = 200\n"  # far less than one call's worst case
    search = services.search_freeze(personas.owner, personas.alpha,
                                    llm_spec(population=2, rounds=[2, 1], budget=budget),
                                    "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "NONE" and run.spent_cost_microusd == 0 and not fake.requests
    assert "budget reservation" in Receipt.objects.filter(kind="llm_call").first().error


def test_openai_compatible_writers_run_the_same_loop_against_a_local_server(personas, tmp_path, monkeypatch,
                                                                           settings):
    from tests.fakes.openai_server import FakeOpenAI

    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setenv("LOCAL_LLM_API_KEY", "local-secret-key-0123")
    plan = {"cand_001": answer(6), "cand_002": answer(8)}
    with FakeOpenAI(plan=plan) as server:
        monkeypatch.setenv("LOCAL_LLM_BASE_URL", server.base_url)
        server.fail_next(("429", 0), ("malformed",))
        repo = plan_repo(tmp_path / "repo", {})
        text = llm_spec(population=3, rounds=[3, 1]).replace('provider = "anthropic"', 'provider = "local"')
        search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD",
                                        repository_path=str(repo))
        services.search_start(personas.owner, search, enqueue=False)
        run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    # This fake server never gives a verdict: the static reviewer, which no text can talk round, read it.
    review = run.winner.reviews.get()
    assert review.reviewer == "crucible static reviewer" and review.verdict == "approve"
    assert "gave no JSON verdict" in review.findings[0]["message"]
    calls = Receipt.objects.filter(kind="llm_call")
    assert {c.resolved_model for c in calls} == {"fake-sonnet-2026-12-01"}
    assert all(c.request_id.startswith("req_oai_") for c in calls)
    assert sum(len(c.detail["retries"]) for c in calls) == 2
    assert sum(1 for c in calls if c.cache_read_tokens) >= 3  # the shared system prompt was cached
    assert server.keys_seen() == {"local-secret-key-0123"}
    assert "local-secret-key-0123" not in json.dumps([r.as_dict() for r in Receipt.objects.all()])


def test_the_demo_runs_end_to_end_with_fake_llm_writers(personas, tmp_path, fake, settings):
    """The demo repository and spec, written by LLM workers (the fake server) instead of scripts."""
    import importlib.util

    from runtime_app.management.commands.crucible_setup import DEMO_REPO_SOURCE, Command

    spec_path = DEMO_REPO_SOURCE / "scripts" / "demo_writer.py"
    loader = importlib.util.spec_from_file_location("demo_writer", spec_path)
    strategies = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(strategies)
    fake.plan = {
        "cand_001": {"path": "code/primes.py", "content": strategies.SIEVE},
        "cand_002": {"path": "code/primes.py", "content": strategies.OFF_BY_ONE},
        "cand_003": {"path": "code/primes.py", "content": strategies.WHEEL},
        "cand_004": {"path": "code/primes.py", "content": strategies.BROKEN},
    }
    settings.DATA_DIR = tmp_path
    repo = Command()._demo_repository()
    text = (REPO_ROOT / "search_app" / "spec_templates" / "demo-scripted.toml").read_text()
    text = text.replace('provider = "command"\ncommand = "python scripts/demo_writer.py"',
                        'provider = "anthropic"\nmodel = "fake-sonnet"')
    text = text.replace("population = 12\nrounds = [12, 4, 2, 1]", "population = 4\nrounds = [4, 2, 1]")
    text = text.replace('reasoning_effort = ["low", "medium", "high", "high"]', 'reasoning_effort = "low"')
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    fate = {c.candidate_id: c.reason for c in search.candidates.all()}
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_001", fate
    assert "gate 1" in fate["cand_002"] and "gate 1" in fate["cand_004"]
    assert Receipt.objects.filter(kind="llm_call").exists()


def test_bedrock_writers_sign_with_the_standard_aws_environment(personas, tmp_path, fake, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-never-recorded-0123456789")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)
    monkeypatch.setenv("BEDROCK_BASE_URL", fake.base_url)
    repo = plan_repo(tmp_path / "repo", {})
    text = llm_spec(population=2, rounds=[2, 1]).replace(
        'provider = "anthropic"\nmodel = "fake-sonnet"',
        'provider = "bedrock"\nmodel = "fake-sonnet-bedrock"')
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    assert all(h["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAFAKEFAKEFAKE/")
               and "/eu-west-1/bedrock/" in h["authorization"] for h in fake.request_headers)
    receipts = json.dumps([r.as_dict() for r in Receipt.objects.all()])
    assert "aws-secret-never-recorded" not in receipts and "AKIAFAKEFAKEFAKE" not in receipts
    assert Receipt.objects.filter(kind="llm_call", resolved_model="fake-sonnet-bedrock-20261201").exists()


def test_a_token_budget_caps_each_writer_before_its_first_call(personas, tmp_path, fake):
    repo = plan_repo(tmp_path / "repo", {})
    budget = "[budget]\nmax_tokens = 4000\n"  # 2,000 per live writer: less than one prompt's worst case
    search = services.search_freeze(personas.owner, personas.alpha,
                                    llm_spec(population=2, rounds=[2, 1], budget=budget),
                                    "HEAD", repository_path=str(repo))
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "NONE" and run.spent_tokens == 0 and not fake.requests
    assert "token limit (2,000)" in Receipt.objects.filter(kind="llm_call").first().error


def test_an_administrators_preset_is_named_by_a_spec_without_a_model(personas, tmp_path, fake):
    from django.core.exceptions import ValidationError as ModelValidationError

    from runtime_app.models import ProviderPreset
    from search_app.spec import spec_validate

    preset = ProviderPreset(name="team-fake", kind="anthropic", model="fake-sonnet", base_url=fake.base_url,
                            concurrency=1, price_model="fake-opus")
    preset.full_clean()
    preset.save()
    text = llm_spec(population=2, rounds=[2, 1]).replace(
        'provider = "anthropic"\nmodel = "fake-sonnet"', 'provider = "team-fake"')
    assert spec_validate(text).valid
    typo = spec_validate(text.replace("team-fake", "team-fak"))
    assert typo.errors[0].suggestion == "team-fake"
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    assert (search.resolved_model_id, search.model_resolution) == ("fake-sonnet", "preset_default")
    services.search_start(personas.owner, search, enqueue=False)
    run = services.search_run_inline(search)
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_002"
    calls = Receipt.objects.filter(kind="llm_call")
    assert {c.requested_model for c in calls} == {"fake-sonnet"}
    assert {c.price_table_version for c in calls} == {calls[0].price_table_version}
    with pytest.raises(ModelValidationError, match="built-in preset"):
        ProviderPreset(name="anthropic", kind="anthropic").full_clean()


def test_preset_effort_defaults_are_frozen_per_round_unless_the_spec_sets_its_own(personas, tmp_path, fake):
    from django.core.exceptions import ValidationError as ModelValidationError

    from runtime_app.models import ProviderPreset

    ProviderPreset.objects.create(name="scouts-low", kind="anthropic", model="fake-sonnet",
                                  base_url=fake.base_url, efforts="low, high")
    text = llm_spec(population=2, rounds=[2, 1]).replace(
        'provider = "anthropic"\nmodel = "fake-sonnet"', 'provider = "scouts-low"')
    repo = plan_repo(tmp_path / "repo", {})
    search = services.search_freeze(personas.owner, personas.alpha, text, "HEAD", repository_path=str(repo))
    assert search.spec_normalized["worker"]["reasoning_effort"] == ["low", "high"]
    services.search_start(personas.owner, search, enqueue=False)
    assert services.search_run_inline(search).outcome == "winner"
    writers = [r for r in fake.requests if "# Crucible search" in str(r["system"])]
    assert writers and {r["thinking"]["budget_tokens"] for r in writers} == {2048}  # round 0: scouts
    assert "Round 0, effort low." in str(writers[0]["messages"][0])
    reviewer = [r for r in fake.requests if "independent reviewer" in str(r["system"])]
    assert reviewer and reviewer[0]["thinking"]["budget_tokens"] == 16384  # the finalists' effort
    # A spec that sets its own effort keeps it; the preset only fills a silence.
    explicit = services.search_freeze(
        personas.owner, personas.alpha, text.replace('[worker]\n', '[worker]\nreasoning_effort = "medium"\n'),
        "HEAD", repository_path=str(repo))
    assert explicit.spec_normalized["worker"]["reasoning_effort"] == "medium"
    assert explicit.preregistration_hash != search.preregistration_hash
    with pytest.raises(ModelValidationError, match="Unknown effort 'fast'"):
        ProviderPreset(name="bad", kind="anthropic", efforts="low, fast").full_clean()


def test_a_models_approval_of_code_that_reaches_into_its_judge_is_overruled_by_the_static_reviewer(
        personas, tmp_path, monkeypatch, settings):
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    # cand_002 scores best and its model reviewer approves it (this fake approves everything), but
    # it walks the interpreter's objects, as code looking for the test runner does.
    hostile = {"path": "code/answer.py",
               "content": "import gc\n\n_seen = len(gc.get_objects())\n\n\ndef answer():\n    return 9\n"}
    with FakeAnthropic(plan={"cand_001": answer(5), "cand_002": hostile}) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        repo = plan_repo(tmp_path / "repo", {})
        search = services.search_freeze(personas.owner, personas.alpha, llm_spec(population=2, rounds=[2, 1]),
                                        "HEAD", repository_path=str(repo))
        services.search_start(personas.owner, search, enqueue=False)
        run = services.search_run_inline(search)
    forger = search.candidates.get(candidate_id="cand_002")
    assert forger.state == "eliminated", forger.reason
    assert ("the reviewer rejects it: reaches the interpreter's live objects (gc) at code/answer.py:1"
            in forger.reason)
    overruled = search.reviews.get(candidate=forger)
    assert overruled.verdict == "reject" and "overruled by the crucible static reviewer" in overruled.reviewer
    assert run.outcome == "winner" and run.winner.candidate_id == "cand_001"
    assert search.reviews.get(candidate=run.winner).reviewer == "anthropic fake-sonnet (read-only tools)"
