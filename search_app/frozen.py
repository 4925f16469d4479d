"""A frozen search as a host sees it: its spec with every default filled in, and the repository
its baseline is read from. Below context, execution, hidden and preflight."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime_app.mirrors import repository_local
from search_app.spec import SearchSpec, spec_validate

if TYPE_CHECKING:
    from search_app.models import Search


def search_spec(search: Search) -> SearchSpec:
    """The spec as frozen: every default filled in, a preset's effort defaults included."""
    if search.spec_normalized:
        return SearchSpec.model_validate(search.spec_normalized)
    report = spec_validate(search.spec_text)
    if report.spec is None:  # frozen specs were valid; this only guards a corrupted row
        raise ValueError(f"{search.search_id}: its frozen spec no longer validates")
    return report.spec


def search_repository(search: Search) -> str:
    """The repository this host reads the search's baseline from: its registered path when that
    holds the baseline here, else this worker's mirror fetched from the web node
    (runtime_app/mirrors.py). For work outside a step; a step has it in its StepContext
    (search_app/context.py), resolved once."""
    return repository_local(search.repository_path, search.baseline_commit,
                            search_pk=search.pk, search_id=search.search_id)
