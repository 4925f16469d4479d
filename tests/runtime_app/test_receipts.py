"""Receipts are written once, exported as JSON, shown by one partial, and only to members."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from runtime_app import services
from runtime_app.models import Receipt
from runtime_app.sandbox import run
from tests.helpers import login

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree(data_dir):
    path = data_dir / "worktrees" / "cand_001"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def receipt(personas, tree) -> Receipt:
    return services.command_run(
        "echo '<script>alert(1)</script>'; exit 2", cwd=tree, timeout=30, isolation="off",
        project=personas.alpha, subject=("candidate", 7), label="cand_007 gate 1",
    )



def test_command_run_writes_the_receipt_with_its_project_and_subject(receipt, personas):
    stored = Receipt.objects.get(pk=receipt.pk)
    assert stored.project == personas.alpha and (stored.subject_type, stored.subject_id) == ("candidate", 7)
    assert stored.label == "cand_007 gate 1" and stored.exit_code == 2 and stored.kind == "command"


def test_a_written_receipt_cannot_be_changed_or_written_twice(receipt):
    receipt.exit_code = 0
    with pytest.raises(ValueError, match="immutable"):
        receipt.save()
    with pytest.raises(ValueError, match="immutable"):
        Receipt.objects.filter(pk=receipt.pk).update(exit_code=0)
    with pytest.raises(ValueError, match="already written"):
        services.receipt_record(receipt)
    assert Receipt.objects.get(pk=receipt.pk).exit_code == 2


def test_the_json_export_has_every_field_and_round_trips(receipt):
    data = json.loads(json.dumps(receipt.as_dict()))
    field_names = {f.attname for f in Receipt._meta.concrete_fields}
    assert field_names <= set(data) and data["outcome"] == "exit 2"
    assert data["argv"][0] == "/bin/sh" and data["isolation"] == "rlimits-only"
    assert data["started_at"].endswith("+00:00")


def test_members_see_the_receipt_page_with_output_escaped(receipt, personas):
    response = login(personas.member).get(f"/receipts/{receipt.pk}/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert(1)" not in body
    assert "rlimits-only" in body and "exit 2" in body and "cand_007 gate 1" in body


def test_members_download_the_same_json_as_the_api(receipt, personas):
    client = login(personas.member)
    download = client.get(f"/receipts/{receipt.pk}.json")
    assert download.status_code == 200 and "attachment" in download["Content-Disposition"]
    api = client.get(f"/api/receipts/{receipt.pk}")
    assert api.status_code == 200 and json.loads(download.content) == api.json()


def test_the_api_lists_a_subject_s_receipts(receipt, personas):
    response = login(personas.member).get("/api/receipts?subject_type=candidate&subject_id=7")
    assert [item["id"] for item in response.json()] == [receipt.pk]
    assert login(personas.outsider).get("/api/receipts?subject_type=candidate&subject_id=7").json() == []


@pytest.mark.parametrize("path", ["/receipts/{id}/", "/receipts/{id}.json", "/api/receipts/{id}"])
def test_outsiders_get_404_and_anonymous_users_must_log_in(receipt, personas, path):
    url = path.format(id=receipt.pk)
    assert login(personas.outsider).get(url).status_code == 404
    assert Client().get(url).status_code in (302, 401)


def test_a_receipt_without_a_project_is_for_superusers_only(tree, personas, django_user_model):
    orphan = services.command_run(["true"], cwd=tree, timeout=10, isolation="off")
    assert login(personas.owner).get(f"/api/receipts/{orphan.pk}").status_code == 404
    admin = django_user_model.objects.create_superuser("root", password="pw-root")
    assert login(admin).get(f"/api/receipts/{orphan.pk}").status_code == 200


def test_an_unknown_receipt_is_a_404_not_a_500(personas):
    assert login(personas.owner).get("/receipts/999999/").status_code == 404
    assert login(personas.owner).get("/api/receipts/999999").status_code == 404


def test_a_timed_out_receipt_says_so_on_its_page(personas, tree):
    receipt = services.command_run(["sleep", "30"], cwd=tree, timeout=0.2, isolation="off",
                                   project=personas.alpha)
    body = login(personas.owner).get(f"/receipts/{receipt.pk}/").content.decode()
    assert "timed out after 0.2 s" in body


def test_llm_fields_are_shown_when_present(personas):
    from django.utils import timezone

    now = timezone.now()
    receipt = services.receipt_record(Receipt(
        kind="llm_call", started_at=now, finished_at=now, duration_seconds=1.5,
        requested_model="claude-sonnet", resolved_model="claude-sonnet-4-5-20250929", request_id="req_1",
        input_tokens=1200, output_tokens=300, cache_read_tokens=1000, cache_write_tokens=0,
        cost_microusd=8100, price_table_version="2026-11",
    ), project=personas.alpha)
    body = login(personas.owner).get(f"/receipts/{receipt.pk}/").content.decode()
    assert "claude-sonnet-4-5-20250929" in body and "$0.0081" in body and "prices 2026-11" in body
    assert receipt.as_dict()["cache_read_tokens"] == 1000


def test_the_sandbox_alone_writes_nothing(tree):
    before = Receipt.objects.count()
    run(["true"], cwd=tree, timeout=10, isolation="off")
    assert Receipt.objects.count() == before
