"""Forms of evolve_app: they collect input; the services (and EvolveConfig) hold the rules."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import Any, cast

from django import forms
from django.core.exceptions import ValidationError
from pydantic import ValidationError as PydanticError

from evolve_app.benchmarks import ALIASES as BENCHMARK_ALIASES
from evolve_app.benchmarks import benchmark_choices
from evolve_app.engines import engine_choices
from evolve_app.extensions import SETTING, allowed_paths
from evolve_app.loop import EvolveConfig

# The run settings the start form offers, in order (EvolveConfig's fields and their bounds).
RUN_SETTINGS = ("batch_size", "holdout_size", "holdout_tolerance", "convergence", "egl_threshold",
                "egl_window", "trajectory_only", "review_mode")


CONVERGENCE_CHOICES = [("", "The agent's default"), ("crucible", "Crucible's (egl_threshold)"),
                       ("a-evolve", "A-Evolve's (epsilon 0.01)")]

# Each setting's label, spelt out (the setting's own name, as the CLI and API take it, is in its hint).
SETTING_LABELS = {
    "batch_size": "Train tasks per cycle",
    "holdout_size": "Holdout tasks",
    "holdout_tolerance": "Largest holdout drop allowed",
    "egl_threshold": "Convergence threshold",
    "egl_window": "Convergence window (cycles)",
    "convergence": "Convergence rule",
    "trajectory_only": "Trajectories only",
    "evolve_layers": "Layers the engine may change",
    "concurrency": "Tasks solved at once",
    "review_mode": "Review mode",
    "engine_options": "Engine options",
}
# What each setting does, for the start form (its own name is added in brackets).
SETTING_HELP = {
    "batch_size": "How many train tasks each cycle solves before the engine changes anything",
    "holdout_size": "Tasks never trained on, scored before and after each change; 0 turns this check off",
    "holdout_tolerance": "A change that lowers the holdout score by more than this (0 to 1) is rolled back",
    "egl_threshold": "The run has converged when the last cycles' train scores differ by less than this",
    "egl_window": "How many recent cycles the convergence check compares (2 or more for Crucible's rule, "
                  "1 or more for A-Evolve's)",
    "convergence": "Crucible's rule: the window's scores differ by less than the threshold. A-Evolve's: "
                   "each of the window's scores within 0.01 of the score before them (A-Evolve's fixed "
                   "epsilon; the threshold is not used). Blank: A-Evolve's for an A-Evolve agent, else "
                   "Crucible's",
    "trajectory_only": "The engine sees what the agent did but no score, success or checker output (the "
                       "observation batches are written without them, as A-Evolve's trajectory_only)",
    "review_mode": "Each change the engine makes waits for an approver before the run goes on",
}


def setting_label(name: str) -> str:
    """A run setting's label for a page (the setting's name itself when it has none)."""
    return SETTING_LABELS.get(name, name.replace("_", " ").capitalize())


def _project_choices(projects: Any) -> list[tuple[Any, str]]:
    return [("", "Pick a project")] + [(project.pk, project.name) for project in projects]


class AgentImportForm(forms.Form):
    # The project id is checked against the user's projects in the view (404 for outsiders).
    project = forms.IntegerField(widget=forms.Select)
    path = forms.CharField(max_length=1000, label="Path on the server",
                           help_text="The absolute path of the workspace folder (manifest.yaml, prompts/, "
                                     "skills/, memory/, tools/). Crucible imports a copy of it (its git "
                                     "history too); the folder itself is never written.")
    name = forms.CharField(max_length=96, required=False, help_text="Defaults to the manifest's name.")

    def __init__(self, *args: Any, projects: Any = (), **kwargs: Any):
        kwargs.setdefault("auto_id", "import_%s")
        super().__init__(*args, **kwargs)
        self.fields["project"].widget.choices = _project_choices(projects)


class AgentImportConfirmForm(forms.Form):
    """The import preview of a folder without manifest.yaml: the inferred manifest, as is or
    edited, is what the import writes into Crucible's copy."""

    project = forms.IntegerField(widget=forms.HiddenInput)
    path = forms.CharField(max_length=1000, widget=forms.HiddenInput)
    name = forms.CharField(max_length=96, required=False, help_text="Defaults to the manifest's name.")
    manifest = forms.CharField(
        max_length=256 * 1024, strip=False, label="manifest.yaml",
        widget=forms.Textarea(attrs={"rows": 16, "wrap": "off", "spellcheck": "false",
                                     "autocapitalize": "off", "autocomplete": "off"}),
        help_text="Checked like any manifest when you confirm; it is written into Crucible's copy of the "
                  "folder only, and only if the whole import succeeds.")

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
    help_text = f"{SETTING_HELP.get(name) or (info.description or '').capitalize()} ({name})."
    label = setting_label(name)
    if name == "convergence":
        return forms.ChoiceField(required=False, label=label, help_text=help_text,
                                 choices=CONVERGENCE_CHOICES)
    if info.annotation is bool:
        return forms.BooleanField(required=False, label=label, help_text=help_text)
    kind = forms.IntegerField if info.annotation is int else forms.FloatField
    attrs = {"step": "any"} if kind is forms.FloatField else {}
    return kind(required=False, label=label, help_text=help_text, widget=forms.NumberInput(attrs=attrs))


class RegisteredChoiceField(forms.ChoiceField):
    """A select of what is registered (engines or benchmarks). A value that is not offered is
    refused by name with the list of what is; `argument_names` may also come as `name:argument`
    (what the CLI, the API and earlier forms send)."""

    def __init__(self, *, kind: str, argument_names: Sequence[str] = (),
                 aliases: dict[str, str] | None = None, **kwargs: Any):
        self.kind, self.argument_names, self.aliases = kind, tuple(argument_names), dict(aliases or {})
        super().__init__(**kwargs)

    def validate(self, value: Any) -> None:
        forms.Field.validate(self, value)
        name = str(value).partition(":")[0]
        name = self.aliases.get(name, name)
        if self.valid_value(value) or (name in self.argument_names and self.valid_value(name)):
            return
        offered = ", ".join(str(key) for key, _ in self._offered())
        message = f"“{value}” is not a registered {self.kind}: choose one of {offered}."
        if "." in name and "/" not in name:  # a dotted path: the trust rule, and how to allow one
            message += (f" {name!r} is a dotted path, and the web and API name only registered {self.kind}s; "
                        f"nothing was imported. An administrator allows it by adding {name} to {SETTING}, "
                        f"or it runs with `manage.py evolve run`.")
        raise ValidationError(message, code="invalid_choice")

    def _offered(self) -> list[tuple[Any, Any]]:
        flat: list[tuple[Any, Any]] = []
        for key, label in cast("list[tuple[Any, Any]]", self.choices):
            flat.extend(label if isinstance(label, (list, tuple)) else [(key, label)])
        return flat


def _registered(choices: list[tuple[str, str]]) -> list[Any]:
    """The registered names, then an administrator's allowed dotted paths as their own group
    (CRUCIBLE_ALLOWED_EXTENSIONS: the service checks each against its kind)."""
    allowed = [(path, path) for path in allowed_paths()]
    if not allowed:
        return list(choices)
    return [("Registered", choices), ("Allowed by an administrator", allowed)]


class RunStartForm(forms.Form):
    """Start an evolution run. Blank settings take EvolveConfig's defaults; each setting's
    problem is reported on its own field."""

    benchmark = RegisteredChoiceField(kind="benchmark", initial="demo", aliases=BENCHMARK_ALIASES,
                                      help_text="Where the tasks come from: the registered benchmarks.")
    benchmark_path = forms.CharField(
        max_length=1000, required=False, label="Benchmark path on the server",
        help_text="Only for task-folder (a folder) and jsonl (a file): an absolute path under the allowed "
                  "directories.")
    engine = RegisteredChoiceField(kind="engine", initial="textbook",
                                   help_text="What changes the workspace each cycle: the registered engines.")
    cycles = forms.IntegerField(initial=5, min_value=1, max_value=200, label="Cycles",
                                error_messages={"min_value": "Give 1 to 200 cycles.",
                                                "max_value": "Give 1 to 200 cycles."},
                                help_text="1 to 200; a run stops early when it converges.")
    engine_options = forms.CharField(
        required=False, max_length=10_000, label="Engine options",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": 'model = "claude-sonnet-4-5"'}),
        help_text="TOML, one key = value per line (e.g. preset, model, effort for skillforge), as "
                  "`evolve run --option` takes them.")

    def __init__(self, *args: Any, agent_path: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # The rule a blank convergence means for this agent (A-Evolve's for an A-Evolve agent).
        self.convergence_default: str | None = None
        if agent_path:
            try:
                self.convergence_default = EvolveConfig().convergence_for(agent_path)
            except (ValueError, OSError):
                self.convergence_default = None
        benchmarks = benchmark_choices()
        self.benchmark_arguments = {name: kind for name, _, kind in benchmarks}
        benchmark = cast(RegisteredChoiceField, self.fields["benchmark"])
        benchmark.choices = _registered([(name, f"{name} — {what}") for name, what, _ in benchmarks])
        benchmark.argument_names = tuple(self.benchmark_arguments)
        engine = cast(RegisteredChoiceField, self.fields["engine"])
        engine.choices = _registered([(name, f"{name} — {what}") for name, what in engine_choices()])
        defaults = EvolveConfig()
        for name in RUN_SETTINGS:
            self.fields[name] = field = _setting_field(name)
            field.initial = getattr(defaults, name)
            if not isinstance(field, (forms.BooleanField, forms.ChoiceField)):  # a blank setting: the default
                field.widget.attrs["placeholder"] = str(field.initial)
        if self.convergence_default:
            rule = cast(forms.ChoiceField, self.fields["convergence"])
            named = dict(CONVERGENCE_CHOICES)[self.convergence_default]
            rule.choices = [("", f"The agent's default: {named}"), *CONVERGENCE_CHOICES[1:]]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        self._benchmark_compose(data)
        config = {name: data[name] for name in RUN_SETTINGS if data.get(name) not in (None, "")}
        self.config: dict[str, Any] = config
        self.config_rejected: set[str | None] = set()
        text = (data.get("engine_options") or "").replace("\r\n", "\n")
        if text.strip():
            try:
                config["engine_options"] = tomllib.loads(text)
            except tomllib.TOMLDecodeError as error:  # its message ends "(at line L, column C)"
                self.config_rejected.add("engine_options")
                self.add_error("engine_options", f"Not TOML: {error}")
        try:  # a blank rule is checked as the agent's default (the service fills it in so)
            EvolveConfig(**{"convergence": self.convergence_default, **config})
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

    def _benchmark_compose(self, data: dict[str, Any]) -> None:
        """`benchmark` becomes the spec the service takes: the name, or `name:path` for a
        benchmark that reads a folder or a file on the server (its path is then required)."""
        name, path = data.get("benchmark"), (data.get("benchmark_path") or "").strip()
        if not name or ":" in name:  # refused above, or already `name:argument`
            if name and path:
                self.add_error("benchmark_path", "Give the path either here or after the colon, not both.")
            return
        kind = self.benchmark_arguments.get(name)
        if kind in ("folder", "file") and not path:
            self.add_error("benchmark_path", f"{name} reads a {kind} on the server: give its absolute path.")
        elif path and name in self.benchmark_arguments and kind is None:
            self.add_error("benchmark_path", f"{name} takes no path: leave this empty.")
        elif path:
            data["benchmark"] = f"{name}:{path}"

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


class CompareForm(forms.Form):
    """Two refs of the workspace (HEAD or any tag) to diff: `base` → `head`."""

    base = forms.ChoiceField(label="From")
    head = forms.ChoiceField(label="To")

    def __init__(self, *args: Any, refs: Sequence[str] = (), **kwargs: Any):
        kwargs.setdefault("auto_id", "compare_%s")
        super().__init__(*args, **kwargs)
        choices = [(ref, "current (HEAD)" if ref == "HEAD" else ref) for ref in refs]
        for name in ("base", "head"):
            field = cast(forms.ChoiceField, self.fields[name])
            field.choices = choices
            field.error_messages["invalid_choice"] = "There is no tag called “%(value)s” in this workspace."
