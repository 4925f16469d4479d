"""Forms of evolve_app: they collect input; the services (and EvolveConfig) hold the rules."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import Any, cast

from django import forms
from pydantic import ValidationError as PydanticError

from evolve_app.loop import EvolveConfig

# The run settings the start form offers, in order (EvolveConfig's fields and their bounds).
RUN_SETTINGS = ("batch_size", "holdout_size", "holdout_tolerance", "egl_threshold", "egl_window",
                "review_mode")


def _project_choices(projects: Any) -> list[tuple[Any, str]]:
    return [("", "Pick a project")] + [(project.pk, project.name) for project in projects]


class AgentImportForm(forms.Form):
    # The project id is checked against the user's projects in the view (404 for outsiders).
    project = forms.IntegerField(widget=forms.Select)
    path = forms.CharField(max_length=1000, label="Path on the server",
                           help_text="The absolute path of the workspace folder (manifest.yaml, prompts/, "
                                     "skills/, memory/, tools/). A folder that is not under git becomes a "
                                     "repository whose first commit is tagged evo-0.")
    name = forms.CharField(max_length=96, required=False, help_text="Defaults to the manifest's name.")

    def __init__(self, *args: Any, projects: Any = (), **kwargs: Any):
        kwargs.setdefault("auto_id", "import_%s")
        super().__init__(*args, **kwargs)
        self.fields["project"].widget.choices = _project_choices(projects)


class AgentImportConfirmForm(forms.Form):
    """The import preview of a folder without manifest.yaml: the inferred manifest, as is or
    edited, is what the import writes."""

    project = forms.IntegerField(widget=forms.HiddenInput)
    path = forms.CharField(max_length=1000, widget=forms.HiddenInput)
    name = forms.CharField(max_length=96, required=False, help_text="Defaults to the manifest's name.")
    manifest = forms.CharField(
        max_length=256 * 1024, strip=False, label="manifest.yaml",
        widget=forms.Textarea(attrs={"rows": 16, "wrap": "off", "spellcheck": "false",
                                     "autocapitalize": "off", "autocomplete": "off"}),
        help_text="Checked like any manifest when you confirm; nothing is written unless the whole import "
                  "succeeds.")

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("auto_id", "preview_%s")
        super().__init__(*args, **kwargs)

    def clean_manifest(self) -> str:
        manifest: str = self.cleaned_data["manifest"]
        return manifest.replace("\r\n", "\n")  # a browser sends CRLF


class DemoAgentForm(forms.Form):
    project = forms.IntegerField(widget=forms.Select)

    def __init__(self, *args: Any, projects: Any = (), **kwargs: Any):
        kwargs.setdefault("auto_id", "demo_%s")
        super().__init__(*args, **kwargs)
        self.fields["project"].widget.choices = _project_choices(projects)


def _setting_field(name: str) -> forms.Field:
    info = EvolveConfig.model_fields[name]
    help_text = info.description or ""
    if info.annotation is bool:
        return forms.BooleanField(required=False, help_text=help_text)
    kind = forms.IntegerField if info.annotation is int else forms.FloatField
    attrs = {"step": "any"} if kind is forms.FloatField else {}
    return kind(required=False, help_text=help_text, widget=forms.NumberInput(attrs=attrs))


class RunStartForm(forms.Form):
    """Start an evolution run. Blank settings take EvolveConfig's defaults; each setting's
    problem is reported on its own field."""

    benchmark = forms.CharField(max_length=500, initial="demo",
                                help_text="A registered name, or folder:PATH or jsonl:PATH under the allowed "
                                          "directories.")
    engine = forms.CharField(max_length=200, initial="textbook",
                             help_text="A registered engine (a dotted path only if an administrator "
                                       "allows it).")
    cycles = forms.IntegerField(initial=5, help_text="1 to 200; a run stops early when it converges.")
    engine_options = forms.CharField(
        required=False, max_length=10_000, label="Engine options",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": 'model = "claude-sonnet-4-5"'}),
        help_text="TOML, one key = value per line (e.g. preset, model, effort for skillforge), as "
                  "`evolve run --option` takes them.")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        defaults = EvolveConfig()
        for name in RUN_SETTINGS:
            self.fields[name] = field = _setting_field(name)
            field.initial = getattr(defaults, name)
            if not isinstance(field, forms.BooleanField):  # a blank setting takes the default
                field.widget.attrs["placeholder"] = str(field.initial)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        config = {name: data[name] for name in RUN_SETTINGS if data.get(name) is not None}
        self.config: dict[str, Any] = config
        self.config_rejected: set[str | None] = set()
        text = (data.get("engine_options") or "").replace("\r\n", "\n")
        if text.strip():
            try:
                config["engine_options"] = tomllib.loads(text)
            except tomllib.TOMLDecodeError as error:  # its message ends "(at line L, column C)"
                self.config_rejected.add("engine_options")
                self.add_error("engine_options", f"Not TOML: {error}")
        try:
            EvolveConfig(**config)
        except PydanticError as error:
            for detail in error.errors():
                field = str(detail["loc"][0]) if detail["loc"] else None
                self.config_rejected.add(field)
                where = str(detail["loc"][1]) if len(detail["loc"]) > 1 else ""
                named = field == "engine_options" and where
                message = f"{where}: {detail['msg']}" if named else detail["msg"]
                self.add_error(field if field in self.fields else None, message)
        data["config"] = config
        return data

    def only_settings_rejected(self) -> bool:
        """True when the form's only problems are settings EvolveConfig rejected: the service,
        which checks the same settings, then refuses too, and reports the benchmark, engine and
        cycles problems alongside."""
        rejected: set[str | None] = getattr(self, "config_rejected", set())
        in_config = all(name in self.config for name in rejected)
        return bool(self.errors) and set(self.errors) <= rejected and in_config

    @property
    def settings_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in RUN_SETTINGS]


class RollbackForm(forms.Form):
    tag = forms.ChoiceField(label="Roll back to")
    confirm = forms.BooleanField(label="Yes: make the workspace equal to this snapshot with a new commit "
                                       "(history is kept)",
                                 error_messages={"required": "Tick the box to confirm the rollback."})

    def __init__(self, *args: Any, tags: Sequence[str] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["tag"]).choices = [(tag, tag) for tag in tags]


class CycleDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
