"""Forms collect input; the services hold the rules and raise ValidationError."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms

from runtime_app.presenters import NAME_MAX_LENGTH
from runtime_app.selectors import projects_for_user, repositories_for_user
from search_app.models import Approval, Merge, Spec
from search_app.selectors import SEARCH_LIST_SORTS, SEARCH_LIST_STATUSES

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from runtime_app.models import Project, Repository
    from search_app.selectors import User


def normalize_newlines(text: str) -> str:
    """Browsers submit a textarea with CRLF line ends, htmx with LF: store and hash one form."""
    return text.replace("\r\n", "\n")


def _choice_field(form: forms.BaseForm, name: str) -> forms.ChoiceField:
    """The form's field `name`, declared a choice field (Form.fields is typed by Field)."""
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    return field


def _model_choice_field(form: forms.BaseForm, name: str) -> forms.ModelChoiceField[Any]:
    """The form's field `name`, declared a model choice field (Form.fields is typed by Field)."""
    field = form.fields[name]
    assert isinstance(field, forms.ModelChoiceField)
    return field


class RepositoryChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.project.name} / {obj.name}"


class SpecEditorForm(forms.Form):
    """The editor: where to freeze (project, repository, ref), a title, and the TOML."""

    project: forms.ModelChoiceField[Project] = forms.ModelChoiceField(
        queryset=None, empty_label="Pick a project")
    repository = RepositoryChoiceField(queryset=None, required=False, empty_label="Pick a repository")
    ref = forms.CharField(max_length=255, required=False, label="Baseline ref")
    title = forms.CharField(max_length=NAME_MAX_LENGTH, required=False,
                            help_text="Defaults to the spec's name.")
    # No max_length: the services and the validator report oversized specs with their own message.
    text = forms.CharField(required=False, strip=False, widget=forms.Textarea)

    def __init__(self, user: User, *args: Any, spec: Spec | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        projects = projects_for_user(user).order_by("name")
        repositories = repositories_for_user(user).order_by("project__name", "name")
        if spec is not None:  # a saved spec belongs to its project for good
            projects = projects.filter(pk=spec.project_id)
            repositories = repositories.filter(project_id=spec.project_id)
        # the choices, as querysets the views filter a submitted id by
        self.projects: QuerySet[Project] = projects
        self.repositories: QuerySet[Repository] = repositories
        _model_choice_field(self, "project").queryset = projects
        _model_choice_field(self, "repository").queryset = repositories

    def clean_text(self) -> str:
        return normalize_newlines(self.cleaned_data["text"])

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        project, repository = data.get("project"), data.get("repository")
        if project is not None and repository is not None and repository.project_id != project.pk:
            self.add_error("repository", f"{repository.name} belongs to project {repository.project.name}.")
        return data


class SpecDiffForm(forms.Form):
    """Which two versions to compare: `?from=1&to=2`."""

    from_ = forms.IntegerField(min_value=1, max_value=2**31 - 1)
    to = forms.IntegerField(min_value=1, max_value=2**31 - 1)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["from"] = self.fields.pop("from_")


class SearchListForm(forms.Form):
    """The searches list's filters and sort, from the query string: `?status=running&q=answer&sort=-best`.

    Nothing here is an error for the user: a value that does not validate is dropped and its
    default used (`filters()`), so an edited or stale URL still shows a list.
    """

    SORT_DEFAULT = "-created"

    status = forms.ChoiceField(required=False)
    outcome = forms.ChoiceField(required=False, choices=[
        ("", "Any outcome"), ("winner", "winner"), ("none", "NONE"), ("undecided", "no outcome yet"),
    ])
    project: forms.ModelChoiceField[Project] = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="All projects")
    q = forms.CharField(required=False, max_length=200, label="Search", widget=forms.TextInput(attrs={
        "type": "search", "id": "search-q", "placeholder": "name, objective or search id",
        "autocomplete": "off",
    }))
    sort = forms.ChoiceField(required=False, widget=forms.HiddenInput)

    def __init__(self, user: User, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _choice_field(self, "status").choices = [("", "Any status"), *SEARCH_LIST_STATUSES.items()]
        _choice_field(self, "sort").choices = [(f"{sign}{key}", f"{sign}{key}")
                                               for key in SEARCH_LIST_SORTS for sign in ("", "-")]
        _model_choice_field(self, "project").queryset = projects_for_user(user).order_by("name")

    def filters(self) -> dict[str, Any]:
        """The valid values, each invalid or missing one replaced by its default."""
        self.is_valid()
        data = getattr(self, "cleaned_data", {})  # an unbound form: every default
        return {
            "status": data.get("status") or "",
            "outcome": data.get("outcome") or "",
            "project": data.get("project"),
            "text": (data.get("q") or "").strip(),
            "sort": data.get("sort") or self.SORT_DEFAULT,
        }


class CommentForm(forms.Form):
    """A comment starting a thread on a candidate (optionally on one changed file and line), or a
    reply in a thread (`reply_to`)."""

    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=10_000, strip=True)
    path = forms.CharField(required=False, max_length=400)
    line = forms.IntegerField(required=False, min_value=1, max_value=10_000_000)
    # Free text on purpose: the service names the two sides in its refusal.
    side = forms.CharField(required=False, max_length=10)
    reply_to = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class DecisionForm(forms.Form):
    """Approve or request changes, bound to the patch hash the person was shown."""

    decision = forms.ChoiceField(choices=[(Approval.Decision.APPROVE, "Approve"),
                                          (Approval.Decision.REQUEST_CHANGES, "Request changes")])
    patch_sha256 = forms.RegexField(regex=r"^[0-9a-f]{64}$", widget=forms.HiddenInput,
                                    error_messages={"invalid": "The patch hash is not a SHA-256."})
    note = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}))


class RevisionForm(forms.Form):
    """Send the winner back to its writer, with what you want (optional)."""

    note = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}))


class MergeForm(forms.Form):
    """Where the approved winner goes: a new branch (default) or an existing one at the baseline."""

    TARGETS = [(Merge.Target.NEW_BRANCH, "A new branch"),
               (Merge.Target.EXISTING_BRANCH, "An existing branch that still points at the baseline")]
    target = forms.ChoiceField(choices=TARGETS, widget=forms.RadioSelect)
    # Not stripped here: merge_create trims ASCII spaces only, and names any other space it refuses.
    branch = forms.CharField(required=False, max_length=255, strip=False)
