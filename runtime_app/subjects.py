"""Event subjects: each subject type maps a subject id to the project it belongs to.

Apps register their types (search, candidate, evolution run …) in AppConfig.ready, so the
websocket consumer can check access to any subject through its project.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime_app.models import Project

SubjectResolver = Callable[[int], "int | None"]
_RESOLVERS: dict[str, SubjectResolver] = {}


def subject_type_register(name: str, resolver: SubjectResolver) -> None:
    _RESOLVERS[name] = resolver


def subject_project_id(subject_type: str, subject_id: int) -> int | None:
    """The project id of a subject, or None if the type or the object is unknown."""
    resolver = _RESOLVERS.get(subject_type)
    return resolver(subject_id) if resolver else None


def _project_resolver(subject_id: int) -> int | None:
    return Project.objects.filter(pk=subject_id).values_list("pk", flat=True).first()


subject_type_register("project", _project_resolver)


# A subject type may also render fragments for the page that watches it (e.g. a search's rows
# and summary), sent after its events so the page updates in place. Each string is sent as its
# own message: table rows parse only in a message of rows (the HTML parser drops a <tr> that
# follows a <div>).
LiveRenderer = Callable[[object, int, list], list]
_LIVE: dict[str, LiveRenderer] = {}


def live_renderer_register(name: str, renderer: LiveRenderer) -> None:
    _LIVE[name] = renderer


def live_fragments(user: object, subject_type: str, subject_id: int, events: list) -> list[str]:
    """Out-of-band messages a subject's page wants with these events (none for most subjects)."""
    renderer = _LIVE.get(subject_type)
    return [message for message in renderer(user, subject_id, events) if message] if renderer else []


# The project page is the team's hub: each app contributes a section (its searches, its agents)
# and the items in it that need someone (awaiting approval, failed, running), shown first.
ATTENTION_ORDER = ("awaiting approval", "failed", "running")


@dataclass
class Attention:
    """One thing on the project that needs a reader: `level` is one of ATTENTION_ORDER."""

    level: str
    label: str
    url: str
    detail: str = ""
    when: Any = None


@dataclass
class ProjectSection:
    """A card on the project page: `template` renders it with `section` (its `context`)."""

    key: str
    title: str
    template: str
    context: dict[str, Any] = field(default_factory=dict)
    attention: list[Attention] = field(default_factory=list)


ProjectSectionProvider = Callable[[Any, Any], "ProjectSection | None"]
_SECTIONS: dict[str, tuple[int, ProjectSectionProvider]] = {}


def project_section_register(key: str, order: int, provider: ProjectSectionProvider) -> None:
    """`provider(user, project)` answers the app's section of the project page (or None)."""
    _SECTIONS[key] = (order, provider)


def project_sections(user: Any, project: Any) -> list[ProjectSection]:
    """The registered sections of a project's page, in their order."""
    found = (provider(user, project) for _, provider in sorted(_SECTIONS.values(), key=lambda item: item[0]))
    return [section for section in found if section is not None]


def attention_sorted(items: list[Attention]) -> list[Attention]:
    """Awaiting approval first, then failed, then running; newest first within each."""
    newest = sorted(items, key=lambda item: item.when.timestamp() if item.when else 0, reverse=True)
    return sorted(newest, key=lambda item: ATTENTION_ORDER.index(item.level)
                  if item.level in ATTENTION_ORDER else len(ATTENTION_ORDER))


# Each subject type may name its subjects the way people know them (a search's `search-…` id,
# `cand_003 of search-…`), never by database id; one query per type for a whole page of events.
SubjectLabeler = Callable[[list[int]], dict[int, str]]
_LABELERS: dict[str, SubjectLabeler] = {}


def subject_label_register(name: str, labeler: SubjectLabeler) -> None:
    _LABELERS[name] = labeler


def _project_labels(ids: list[int]) -> dict[int, str]:
    return dict(Project.objects.filter(pk__in=ids).values_list("pk", "name"))


subject_label_register("project", _project_labels)


def subject_labels_attach(items: list) -> list:
    """Set `subject_label` on each item with a `subject_type` and `subject_id` (events, receipts):
    its subject's name, or just the type when nothing names it (never the database id)."""
    wanted: dict[str, set[int]] = {}
    for item in items:
        if item.subject_type in _LABELERS and item.subject_id is not None:
            wanted.setdefault(item.subject_type, set()).add(item.subject_id)
    labels = {(kind, pk): text for kind, ids in wanted.items()
              for pk, text in _LABELERS[kind](sorted(ids)).items()}
    for item in items:
        item.subject_label = labels.get((item.subject_type, item.subject_id)) or item.subject_type or ""
    return items
