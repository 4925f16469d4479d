"""Every write in search_app: spec drafts and versions, and freezing searches."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from runtime_app import roles
from runtime_app.models import Project, Repository
from runtime_app.services import _require, _require_member, audit_record, event_emit
from search_app.freeze import FreezeError, freeze_inputs
from search_app.models import Search, Spec, SpecVersion
from search_app.spec import MAX_SPEC_BYTES, spec_validate


def _check_title(title: str) -> str:
    title = (title or "").strip()
    if not 1 <= len(title) <= 96:
        raise ValidationError({"title": "Give the spec a title of 1–96 characters."})
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


def _version_add(user: Any, spec: Spec, text: str) -> SpecVersion:
    latest = spec.versions.order_by("-number").first()
    if latest is not None and latest.text == text:
        return latest  # saving unchanged text adds no version
    version = SpecVersion.objects.create(
        spec=spec, number=(latest.number + 1 if latest else 1), text=text,
        valid=spec_validate(text).valid, created_by=user,
    )
    Spec.objects.filter(pk=spec.pk).update(updated_at=version.created_at)
    return version


def spec_create(user: Any, project: Project, title: str, text: str) -> Spec:
    """Save a new draft; drafts may be invalid, freezing is where validity is required."""
    _require(user, roles.OPERATE)
    _require_member(user, project)
    title, text = _check_title(title), _check_text(text)
    with transaction.atomic():
        spec = Spec.objects.create(project=project, title=title, created_by=user)
        _version_add(user, spec, text)
    return spec


def spec_save(user: Any, spec: Spec, text: str) -> SpecVersion:
    _require(user, roles.OPERATE)
    _require_member(user, spec.project)
    text = _check_text(text)
    with transaction.atomic():
        Spec.objects.select_for_update().filter(pk=spec.pk).first()
        return _version_add(user, spec, text)


def spec_duplicate(user: Any, spec: Spec) -> Spec:
    _require(user, roles.OPERATE)
    _require_member(user, spec.project)
    latest = spec.latest
    with transaction.atomic():
        copy = Spec.objects.create(
            project=spec.project, title=f"{spec.title} (copy)"[:96], duplicated_from=spec,
            created_by=user,
        )
        _version_add(user, copy, latest.text if latest else "")
    return copy


def search_freeze(
    user: Any,
    project: Project,
    text: str,
    ref: str,
    *,
    repository: Repository | None = None,
    repository_path: str | None = None,
    spec_version: SpecVersion | None = None,
) -> Search:
    """Freeze a spec against a baseline: resolve, hash and record it; immutable from here.

    Web and API callers name a registered repository; the local CLI may give a path.
    Freezing the same inputs again returns the search already recorded.
    """
    _require(user, roles.OPERATE)
    _require_member(user, project)
    if repository is not None:
        if repository.project_id != project.pk:
            raise ValidationError({"repository": "That repository belongs to another project."})
        repository_path = repository.path
    if not repository_path:
        raise ValidationError({"repository": "Pick a registered repository."})
    try:
        frozen = freeze_inputs(_check_text(text), repository_path, ref)
    except FreezeError as error:
        raise ValidationError({"__all__": error.problems}) from None
    existing = Search.objects.filter(search_id=frozen.search_id).first()
    if existing is not None:
        if existing.project_id != project.pk:
            raise ValidationError("These exact inputs are already frozen in another project.")
        return existing
    try:
        with transaction.atomic():
            search = Search.objects.create(
                project=project, search_id=frozen.search_id,
                preregistration_hash=frozen.preregistration_hash, spec_version=spec_version,
                repository=repository, repository_path=frozen.repository_path, ref=ref,
                name=frozen.spec.name, objective=frozen.spec.objective,
                baseline_commit=frozen.baseline_commit,
                requested_model_id=frozen.requested_model_id,
                resolved_model_id=frozen.resolved_model_id,
                model_resolution=frozen.model_resolution,
                public_evidence_hash=frozen.public_evidence_hash,
                evaluator_hash=frozen.evaluator_hash, spec_text=text,
                spec_normalized=frozen.record["spec"], hashed_inputs=frozen.hashed_inputs(),
                candidate_batches=frozen.candidate_batches, created_by=user,
            )
            audit_record(user, "search.freeze", project=project,
                         target=f"{search.search_id} {search.name}",
                         detail={"preregistration_hash": search.preregistration_hash})
            event_emit(project, "search", search.pk, "search.frozen",
                       {"message": f"{search.name} frozen as {search.search_id}"})
    except IntegrityError:  # frozen concurrently by someone else: theirs stands
        return Search.objects.get(search_id=frozen.search_id)
    return search


def spec_draft_save(
    user: Any, project: Project, spec: Spec | None, title: str, text: str
) -> tuple[Spec, SpecVersion]:
    """Save text as a new spec (spec None) or as the next version of spec."""
    if spec is None:
        spec = spec_create(user, project, title, text)
        return spec, spec.latest
    return spec, spec_save(user, spec, text)


def spec_draft_freeze(
    user: Any, project: Project, spec: Spec | None, title: str, text: str, ref: str,
    repository: Repository,
) -> Search:
    """Save the text as a version and freeze that version; a failed freeze saves nothing."""
    with transaction.atomic():
        _, version = spec_draft_save(user, project, spec, title, text)
        return search_freeze(user, project, text, ref, repository=repository, spec_version=version)
