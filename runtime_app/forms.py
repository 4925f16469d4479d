"""Forms collect input; the services hold the rules and raise ValidationError."""

from django import forms


class ProjectForm(forms.Form):
    name = forms.CharField(max_length=96)
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(
        attrs={"rows": 2}))


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="What uses it, e.g. 'laptop CLI'.")


class RepositoryForm(forms.Form):
    # The project id is checked against the user's projects in the view (404 for outsiders).
    project = forms.IntegerField(widget=forms.Select)
    path = forms.CharField(max_length=1000, label="Path on the server",
                           help_text="The absolute path of a git clone with a working tree.")
    name = forms.CharField(max_length=96, required=False,
                           help_text="Defaults to the directory's name.")

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].widget.choices = [("", "Pick a project")] + [
            (project.pk, project.name) for project in projects
        ]
