"""Event subjects: each subject type maps a subject id to the project it belongs to.

Apps register their types (search, candidate, evolution run …) in AppConfig.ready, so the
websocket consumer can check access to any subject through its project.
"""

from __future__ import annotations

from collections.abc import Callable

SubjectResolver = Callable[[int], "int | None"]
_RESOLVERS: dict[str, SubjectResolver] = {}


def subject_type_register(name: str, resolver: SubjectResolver) -> None:
    _RESOLVERS[name] = resolver


def subject_project_id(subject_type: str, subject_id: int) -> int | None:
    """The project id of a subject, or None if the type or the object is unknown."""
    resolver = _RESOLVERS.get(subject_type)
    return resolver(subject_id) if resolver else None


def _project_resolver(subject_id: int) -> int | None:
    from runtime_app.models import Project

    return Project.objects.filter(pk=subject_id).values_list("pk", flat=True).first()


subject_type_register("project", _project_resolver)
