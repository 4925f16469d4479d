"""Freeze refuses a writers' provider with no key; Start says when the key has gone since, or the
server does not answer, before anything is spent, and refuses until the person starts it anyway
(the page, the API, the CLI)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from runtime_app.services import api_token_create, repository_register
from search_app import services
from search_app.models import Search, SearchRun
from search_app.preflight import provider_problems
from tests.fakes.openai_server import FakeOpenAI
from tests.gitrepo import repo_create
from tests.helpers import free_port, login, text_of

pytestmark = pytest.mark.django_db
SEED = (Path(__file__).parent / "specs" / "seed_example.toml").read_text()  # provider = "deepseek"
LOCAL = SEED.replace('provider = "deepseek"', 'provider = "local"')


@pytest.fixture(autouse=True)
def no_keys(monkeypatch, data_dir):
    for name in ("DEEPSEEK_API_KEY", "LOCAL_LLM_API_KEY", "LOCAL_LLM_BASE_URL", "DEEPSEEK_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def repository(personas, tmp_path):
    files = {"code/certificate.py": "print('ok')\n", "certificate.py": "print('ok')\n",
             "expected_result.json": "{}\n", "tests/test_x.py": "\n",
             "scripts/benchmark_candidate.sh": "#!/bin/sh\necho '{}'\n"}
    path = repo_create(tmp_path / "roots" / "certificate", files,
                       executable=("scripts/benchmark_candidate.sh",))
    return repository_register(personas.member, personas.alpha, str(path), trusted=True)


def frozen(personas, repository, text: str = SEED) -> Search:
    """Frozen while the key lives only with the workers (`without_key`): Start still asks."""
    return services.search_freeze(personas.member, personas.alpha, text, "main", repository=repository,
                                  without_key=True)


def test_a_cloud_provider_without_its_key_is_named_with_the_variable_to_set(monkeypatch):
    [problem] = provider_problems("deepseek")
    assert "no DEEPSEEK_API_KEY is set" in problem and "changed nothing" in problem
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-deepseek-0123456789")
    assert provider_problems("deepseek") == []
    assert provider_problems("command") == []


def test_an_agent_cli_preset_needs_its_cli_installed_and_its_provider_s_key(monkeypatch, settings, tmp_path):
    import dataclasses

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-0123456789")
    settings.CONFIG = dataclasses.replace(settings.CONFIG, agent_cli_dir=tmp_path / "clis")
    [problem] = provider_problems("claude-code")
    assert f"{tmp_path / 'clis'}/node_modules/.bin/claude is not installed" in problem
    assert "scripts/install_agent_clis.sh" in problem and "CRUCIBLE_AGENT_CLI_DIR" in problem
    claude = tmp_path / "clis" / "node_modules" / ".bin" / "claude"
    claude.parent.mkdir(parents=True)
    claude.write_text("#!/bin/sh\n")
    assert provider_problems("claude-code") == []
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    [problem] = provider_problems("claude-code")
    assert "no ANTHROPIC_API_KEY is set" in problem


def test_a_local_server_must_answer_a_connect_and_needs_no_key(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    monkeypatch.setenv("LOCAL_LLM_BASE_URL", url)
    [problem] = provider_problems("local")
    assert f"nothing answers at {url}" in problem and "LOCAL_LLM_BASE_URL" in problem
    with FakeOpenAI() as server:
        monkeypatch.setenv("LOCAL_LLM_BASE_URL", server.base_url)
        assert provider_problems("local") == []


def test_the_api_refuses_to_start_without_the_key_until_asked_to_start_anyway(personas, repository):
    search = frozen(personas, repository)
    _, plain = api_token_create(personas.member, "tests")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {plain}")
    refused = api.post(f"/api/searches/{search.search_id}/start")
    assert refused.status_code == 400
    assert "DEEPSEEK_API_KEY" in refused.json()["detail"] and "start_anyway=true" in refused.json()["detail"]
    assert not SearchRun.objects.exists()
    started = api.post(f"/api/searches/{search.search_id}/start?start_anyway=true")
    assert started.status_code == 202, started.json()
    assert SearchRun.objects.filter(search=search).exists()


def test_freezing_through_the_api_without_the_key_is_a_400_naming_it(personas, repository):
    _, plain = api_token_create(personas.member, "tests")
    body = {"project_id": personas.alpha.pk, "repository_id": repository.pk, "ref": "main", "text": SEED}
    response = Client(HTTP_AUTHORIZATION=f"Bearer {plain}").post("/api/searches", body,
                                                                  content_type="application/json")
    assert response.status_code == 400
    assert "no DEEPSEEK_API_KEY is set" in str(response.json())
    assert not Search.objects.exists()


def test_the_start_button_asks_first_and_start_anyway_starts(personas, repository):
    search = frozen(personas, repository)
    client = login(personas.member)
    asked = client.post(f"/searches/{search.search_id}/start/")
    assert asked.status_code == 409
    page = text_of(asked)
    assert "The writers cannot reach their model" in page and "DEEPSEEK_API_KEY" in page
    assert 'name="start_anyway" value="1"' in page and not SearchRun.objects.exists()
    started = client.post(f"/searches/{search.search_id}/start/", {"start_anyway": "1"})
    assert started.status_code == 302 and SearchRun.objects.filter(search=search).exists()


def test_freezing_in_the_editor_without_the_key_is_refused_naming_it(personas, repository):
    client = login(personas.member)
    response = client.post("/searches/specs/new/", {
        "project": personas.alpha.pk, "repository": repository.pk, "ref": "main", "title": "",
        "text": SEED, "action": "freeze"})
    assert response.status_code == 400
    assert "Not frozen" in text_of(response) and "no DEEPSEEK_API_KEY is set" in text_of(response)
    assert not Search.objects.exists()


def test_the_cli_refuses_to_run_it_and_names_the_way_to_go_on(personas, repository):
    search = frozen(personas, repository)
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_code:
        call_command("search", "run", search.search_id, "--user", "member", stdout=io.StringIO(),
                     stderr=stderr)
    assert exit_code.value.code == 1
    assert "no DEEPSEEK_API_KEY" in stderr.getvalue()
    assert f"search run {search.search_id} --start-anyway" in stderr.getvalue()
    assert not SearchRun.objects.exists()
