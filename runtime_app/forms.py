"""Forms collect input; the services hold the rules and raise ValidationError."""

from urllib.parse import urlencode

from django import forms
from django.core.exceptions import ValidationError

from runtime_app.presenters import NAME_MAX_LENGTH


class ProjectForm(forms.Form):
    name = forms.CharField(max_length=NAME_MAX_LENGTH)
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(
        attrs={"rows": 2}))


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="What uses it, e.g. 'laptop CLI'.")


class NotificationSettingForm(forms.Form):
    email_address = forms.EmailField(required=False, label="Email address")
    email = forms.BooleanField(required=False, label="Send me notifications by email")
    approval_waiting = forms.BooleanField(required=False, label="A winner I may approve is waiting")
    search_done = forms.BooleanField(required=False,
                                     label="A search I started finished, failed or was cancelled")
    replies = forms.BooleanField(required=False, label="Someone replied where I commented")


class WebhookForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="e.g. team Slack")
    url = forms.CharField(max_length=2000, label="URL",
                          help_text="http:// or https://; Slack-compatible JSON is POSTed to it.")
    secret = forms.CharField(max_length=200, required=False, label="Shared secret",
                             widget=forms.PasswordInput(render_value=False),
                             help_text="Signs each delivery (X-Crucible-Signature). Leave empty and Crucible "
                             "makes one, shown once.")


class RepositoryForm(forms.Form):
    # The project id is checked against the user's projects in the view (404 for outsiders).
    project = forms.IntegerField(widget=forms.Select)
    path = forms.CharField(max_length=1000, label="Path on the server", required=False,
                           help_text="The absolute path of a git clone with a working tree.")
    url = forms.CharField(max_length=1000, label="or git URL", required=False,
                          help_text="A remote under an allowed prefix (CRUCIBLE_REPO_URLS): the server "
                          "clones it, fetches it before each freeze and pushes merges back to it.")
    name = forms.CharField(max_length=NAME_MAX_LENGTH, required=False,
                           help_text="Defaults to the directory's or the URL's last name.")

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].widget.choices = [("", "Pick a project")] + [
            (project.pk, project.name) for project in projects
        ]


ROLE_CHOICES = [("viewer", "viewer: reads and comments"),
                ("operator", "operator: also registers repositories, runs searches and evolution"),
                ("approver", "approver: also approves, requests changes and merges"),
                ("admin", "project admin: also manages members")]


class MemberAddForm(forms.Form):
    who = forms.CharField(max_length=254, label="Username or email",
                          help_text="An email address no account has gets an invitation: you see its "
                                    "link once, to copy, and it is emailed to them.")
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial="viewer")


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)


class AuditFilterForm(forms.Form):
    """The audit log's filter, read from GET: a bad value is reported and left out, never fatal."""

    action = forms.RegexField(
        regex=r"^[A-Za-z0-9_.-]+$", max_length=64, required=False,
        help_text="How the action begins: merge, approval, role, or a full name such as search.freeze.",
        error_messages={"invalid": "Use letters, digits, dots, dashes or underscores."},
        widget=forms.TextInput(
            attrs={"type": "search", "list": "audit-actions", "placeholder": "e.g. merge"}),
    )
    actor = forms.CharField(max_length=150, required=False, label="Who", widget=forms.TextInput(
        attrs={"type": "search", "list": "audit-actors", "placeholder": "username or system"}))
    project = forms.ChoiceField(required=False)
    date_from = forms.DateField(required=False, label="From", widget=forms.DateInput(
        attrs={"type": "date"}, format="%Y-%m-%d"))
    date_to = forms.DateField(required=False, label="To", widget=forms.DateInput(
        attrs={"type": "date"}, format="%Y-%m-%d"))
    q = forms.CharField(max_length=200, required=False, label="Target contains", widget=forms.TextInput(
        attrs={"type": "search", "placeholder": "search id, branch, user…"}))

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [("", "Any project"), ("none", "No project")] + [
            (str(project.pk), project.name) for project in projects
        ]

    def clean(self):
        data = super().clean()
        if data.get("date_from") and data.get("date_to") and data["date_from"] > data["date_to"]:
            self.add_error("date_to", "The end of the range is before its start.")
        return data

    def filters(self) -> dict:
        """The fields that validated and are set; the invalid ones stay out (see form.errors)."""
        self.is_valid()
        return {name: value for name, value in self.cleaned_data.items() if value not in ("", None)}

    def query(self, **extra) -> str:
        """The filter as a query string of its valid, set fields, plus `extra`."""
        values = {name: value.isoformat() if hasattr(value, "isoformat") else value
                  for name, value in self.filters().items()}
        return urlencode({**values, **{key: value for key, value in extra.items() if value}})


class RepositoryRefForm(forms.Form):
    """The branch or tag whose history the repository page shows, one of the repository's refs."""

    ref = forms.ChoiceField(label="Branch or tag")

    def __init__(self, *args, branches=(), tags=(), **kwargs):
        super().__init__(*args, **kwargs)
        choices = []
        if branches:
            choices.append(("Branches", [(name, name) for name in branches]))
        if tags:
            choices.append(("Tags", [(name, name) for name in tags]))
        self.fields["ref"].choices = choices


def form_errors_apply(form: forms.Form, error: ValidationError) -> None:
    """A service's ValidationError shown on the form: on its field where the form has one."""
    if hasattr(error, "error_dict"):
        for field, errors in error.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, error.messages)
