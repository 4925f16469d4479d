"""Forms collect input; the services hold the rules and raise ValidationError."""

from django import forms


class ProjectForm(forms.Form):
    name = forms.CharField(max_length=96)
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(
        attrs={"rows": 2}))


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="What uses it, e.g. 'laptop CLI'.")
