"""Freezing a spec version into a search: its inputs fixed, its hidden files and baseline recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from runtime_app import access
from runtime_app.models import Project, Repository
from runtime_app.services import audit_record, event_emit, repository_fetch
from search_app.freeze import FreezeError, FrozenInputs, freeze_inputs
from search_app.models import HiddenFile, Search, Spec, SpecVersion
from search_app.preflight import freeze_problems
from search_app.services.specs import _check_text, spec_draft_save

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def search_freeze(
    user: User,
    project: Project,
    text: str,
    ref: str,
    *,
    repository: Repository | None = None,
    repository_path: str | None = None,
    spec_version: SpecVersion | None = None,
    without_key: bool = False,
) -> Search:
    """Freeze a spec against a baseline: resolve, hash and record it; immutable from here.

    Web and API callers name a registered repository; the local CLI may give a path.
    Freezing the same inputs again returns the search already recorded. A spec that cannot run
    is refused (`freeze_problems`: a command's program, script or named file missing, the
    writers' provider without its key); `without_key` lets the key live only with the workers.
    """
    access.require(user, access.OPERATOR, project)
    repository_path = _repository_path(project, repository, repository_path)
    try:
        frozen = freeze_inputs(_check_text(text), repository_path, ref)
    except FreezeError as error:
        raise ValidationError({"__all__": error.problems}) from None
    existing = Search.objects.filter(search_id=frozen.search_id).first()
    if existing is not None:
        if existing.project_id != project.pk:
            raise ValidationError("These exact inputs are already frozen in another project.")
        return existing
    # A spec that cannot run is refused now, not after every candidate ran.
    cannot_start = freeze_problems(frozen.spec, frozen.repository_path, frozen.baseline_commit,
                                   without_key=without_key)
    if cannot_start:
        raise ValidationError({"__all__": cannot_start})
    try:
        with transaction.atomic():
            return _search_record(user, project, frozen, text, ref, repository, spec_version)
    except IntegrityError:  # frozen concurrently by someone else: theirs stands
        return Search.objects.get(search_id=frozen.search_id)


def _repository_path(project: Project, repository: Repository | None, repository_path: str | None) -> str:
    """Where the baseline is read: the registered repository's clone (fetched now), or the path the
    local CLI gave."""
    if repository is not None:
        if repository.project_id != project.pk:
            raise ValidationError({"repository": "That repository belongs to another project."})
        repository_fetch(repository)  # a repository registered by URL: its remote's branches as of now
        repository_path = repository.path
    if not repository_path:
        raise ValidationError({"repository": "Pick a registered repository."})
    return repository_path


def _search_record(user: User, project: Project, frozen: FrozenInputs, text: str, ref: str,
                   repository: Repository | None, spec_version: SpecVersion | None) -> Search:
    """The frozen search, its hidden files, its audit entry and its event (in the caller's transaction)."""
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
    HiddenFile.objects.bulk_create([  # host hidden files: the bytes frozen with the search
        HiddenFile(search=search, path=item.path, source=item.source, sha256=item.sha256,
                   size=len(item.data), executable=item.executable, content=item.data)
        for item in frozen.hidden
    ])
    audit_record(user, "search.freeze", project=project,
                 target=f"{search.search_id} {search.name}",
                 detail={"preregistration_hash": search.preregistration_hash})
    event_emit(project, "search", search.pk, "search.frozen",
               {"message": f"{search.name} frozen as {search.search_id}"})
    return search


def spec_draft_freeze(
    user: User, project: Project, spec: Spec | None, title: str, text: str, ref: str,
    repository: Repository,
) -> Search:
    """Save the text as a version and freeze that version; a failed freeze saves nothing."""
    with transaction.atomic():
        _, version = spec_draft_save(user, project, spec, title, text)
        return search_freeze(user, project, text, ref, repository=repository, spec_version=version)
