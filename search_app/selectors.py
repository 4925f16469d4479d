"""Reads for search_app, filtered by project access."""

from __future__ import annotations

import difflib
from typing import Any

from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import Http404

from runtime_app.selectors import projects_for_user
from search_app.models import Search, Spec, SpecVersion


def specs_for_user(user: Any) -> QuerySet[Spec]:
    return Spec.objects.select_related("project").filter(project__in=projects_for_user(user))


def spec_list_for_user(user: Any) -> QuerySet[Spec]:
    """Specs with their number of versions and the latest version's number and validity."""
    latest = SpecVersion.objects.filter(spec=OuterRef("pk")).order_by("-number")
    return specs_for_user(user).select_related("created_by").annotate(
        version_count=Count("versions"),
        latest_number=Subquery(latest.values("number")[:1]),
        latest_valid=Subquery(latest.values("valid")[:1]),
    )


def spec_for_user(user: Any, spec_id: int) -> Spec:
    spec = specs_for_user(user).filter(pk=spec_id).first()
    if spec is None:
        raise Http404("No such spec.")
    return spec


def spec_version_get(spec: Spec, number: int) -> SpecVersion:
    version = spec.versions.filter(number=number).first()
    if version is None:
        raise Http404(f"{spec.title} has no version {number}.")
    return version


def _diff_lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):  # else the diff glues `-last` and `+last` together
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def spec_diff(old: SpecVersion, new: SpecVersion) -> str:
    """A unified diff between two versions of a spec."""
    return "".join(difflib.unified_diff(
        _diff_lines(old.text), _diff_lines(new.text),
        fromfile=f"v{old.number}", tofile=f"v{new.number}",
    ))


def searches_for_user(user: Any) -> QuerySet[Search]:
    return Search.objects.select_related("project", "created_by").filter(
        project__in=projects_for_user(user)
    )


def search_for_user(user: Any, search_id: str) -> Search:
    search = searches_for_user(user).filter(search_id=search_id).first()
    if search is None:
        raise Http404("No such search.")
    return search
