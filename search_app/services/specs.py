"""Spec drafts and their versions: create, save, duplicate, and drafting a spec with a model."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from runtime_app import access
from runtime_app.fleet import PRESETS
from runtime_app.llm import LLMError, ToolChat
from runtime_app.models import Project
from runtime_app.presenters import NAME_MAX_LENGTH
from runtime_app.services import receipt_record
from search_app.models import Spec, SpecVersion
from search_app.reference import spec_reference_markdown
from search_app.spec import MAX_SPEC_BYTES, spec_validate
from search_app.spec_templates import spec_template_get

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def _check_title(title: str) -> str:
    title = (title or "").strip()
    if not 1 <= len(title) <= NAME_MAX_LENGTH:
        raise ValidationError({"title": f"Give the spec a title of 1–{NAME_MAX_LENGTH} characters."})
    return title


def _check_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # lone surrogates cannot be stored or hashed
        raise ValidationError({"text": f"The spec has a character that is not valid text at "
                                       f"offset {error.start}."}) from None
    if len(text.encode("utf-8")) > MAX_SPEC_BYTES:
        raise ValidationError({"text": f"A spec may be at most {MAX_SPEC_BYTES:,} bytes."})
    if "\x00" in text:
        raise ValidationError({"text": "A spec cannot contain NUL characters."})
    return text


def _version_add(user: User, spec: Spec, text: str) -> SpecVersion:
    latest = spec.versions.order_by("-number").first()
    if latest is not None and latest.text == text:
        return latest  # saving unchanged text adds no version
    version = SpecVersion.objects.create(
        spec=spec, number=(latest.number + 1 if latest else 1), text=text,
        valid=spec_validate(text).valid, created_by=user,
    )
    Spec.objects.filter(pk=spec.pk).update(updated_at=version.created_at)
    return version


def spec_create(user: User, project: Project, title: str, text: str) -> Spec:
    """Save a new draft; drafts may be invalid, freezing is where validity is required."""
    access.require(user, access.OPERATOR, project)
    title, text = _check_title(title), _check_text(text)
    with transaction.atomic():
        spec = Spec.objects.create(project=project, title=title, created_by=user)
        _version_add(user, spec, text)
    return spec


def spec_save(user: User, spec: Spec, text: str) -> SpecVersion:
    access.require(user, access.OPERATOR, spec.project)
    text = _check_text(text)
    with transaction.atomic():
        Spec.objects.select_for_update().filter(pk=spec.pk).first()
        return _version_add(user, spec, text)


def spec_duplicate(user: User, spec: Spec) -> Spec:
    access.require(user, access.OPERATOR, spec.project)
    latest = spec.latest
    with transaction.atomic():
        copy = Spec.objects.create(
            project=spec.project, title=f"{spec.title} (copy)"[:NAME_MAX_LENGTH], duplicated_from=spec,
            created_by=user,
        )
        _version_add(user, copy, latest.text if latest else "")
    return copy


def spec_draft_save(
    user: User, project: Project, spec: Spec | None, title: str, text: str
) -> tuple[Spec, SpecVersion]:
    """Save text as a new spec (spec None) or as the next version of spec."""
    if spec is None:
        spec = spec_create(user, project, title, text)
        latest = spec.latest
        assert latest is not None  # spec_create writes its first version
        return spec, latest
    return spec, spec_save(user, spec, text)


DRAFT_INSTRUCTIONS = """You draft Crucible search specs. A person describes what they want; you reply
with one complete spec in TOML, in a ```toml block, and nothing else of substance. Follow the
reference exactly (keys, types, ranges): population equals the first round; rounds strictly
decrease to 1; concurrency at most 16 and at most the population. Keep commands and paths
plausible for the repository described; the person will edit them before saving. Score time
objectives on the runtime's own figures (`runtime:wall_seconds`, `runtime:cpu_seconds`,
`runtime:max_rss_kib`) unless the person asks for a figure their score command reports; then
say what it measures with `score.reported` ("time_ms" and the other time or memory units, checked
against the runtime's measurement, with direction = "minimize"; "other" for accuracy, counts and
the like, which the score command's own process writes to $CRUCIBLE_REPORT_FD while it runs the
candidate's code only in a child process).
"""


def spec_draft_write(user: User, project: Project, description: str) -> tuple[str, str]:
    """Ask the configured model for a spec; returns (TOML text, who drafted it). Nothing is saved:
    the text is shown in the editor as an editable draft and validated like any other."""
    access.require(user, access.OPERATOR, project)
    description = (description or "").strip()
    if not 10 <= len(description) <= 4000:
        raise ValidationError({"description": "Describe what you want in 10 to 4,000 characters."})
    configured = settings.CONFIG.draft_model
    if not configured:
        raise ValidationError({"description": "Drafting is off: an administrator sets "
                                              "CRUCIBLE_DRAFT_MODEL (e.g. anthropic:claude-sonnet-4-5) "
                                              "and the provider's key."})
    preset_name, model = configured.split(":", 1)
    preset = PRESETS.get(preset_name)
    if preset is None or preset.kind in ("command", "agent-cli"):  # drafting calls the model itself
        raise ValidationError({"description": f"CRUCIBLE_DRAFT_MODEL names {preset_name!r}, "
                                              "not an LLM preset."})
    example = spec_template_get("speed-up")
    assert example is not None  # one of SPEC_TEMPLATES
    prefix = (DRAFT_INSTRUCTIONS + "\n# The spec reference\n\n" + spec_reference_markdown()
              + "\n# An example\n\n```toml\n" + example.text + "```\n")
    chat = ToolChat(preset.kind, model, prefix, description, [], "off", base_url=preset.base_url(),
                    key_variable=preset.key_variable, account=preset.name)
    try:
        reply, _ = chat.turn(lambda receipt: receipt_record(
            receipt, project=project, subject=("project", project.pk), label="spec draft"), None)
    except LLMError as error:
        raise ValidationError({"description": f"The model could not draft a spec: {error}"}) from None
    content = chat.messages[-1]["content"]
    if not isinstance(content, str):
        content = "\n".join(block.get("text", "") for block in content if isinstance(block, dict))
    found = re.search(r"```(?:toml)?\s*\n(.*?)```", content, re.DOTALL)
    text = (found.group(1) if found else content).strip() + "\n"
    if not text.strip():
        raise ValidationError({"description": "The model answered without a spec; try describing it again."})
    return _check_text(text), f"{preset.name} {reply.receipt.resolved_model or model}"
