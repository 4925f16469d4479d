"""What both apps stand on: projects and access, events, audit entries, API tokens."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from runtime_app.fleet import EFFORTS, PRESETS, Preset
from runtime_app.presenters import NAME_MAX_LENGTH


class Project(models.Model):
    """A team's space: repositories, searches and agents belong to one project."""

    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="ProjectMembership", related_name="projects"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ProjectRole(models.TextChoices):
    """What a member may do in one project; each role may do everything the ones before it may."""

    VIEWER = "viewer", "viewer"
    OPERATOR = "operator", "operator"
    APPROVER = "approver", "approver"
    ADMIN = "admin", "project admin"


class ProjectMembership(models.Model):
    """Who may see a project's objects, and their role in it."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=ProjectRole.choices, default=ProjectRole.VIEWER)
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="unique_project_member")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}"


class Repository(models.Model):
    """A git repository that a project's searches target: registered by a path on the web node,
    or by a git URL the web node keeps a clone of at `path` (runtime_app.remotes)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="repositories")
    name = models.CharField(max_length=NAME_MAX_LENGTH)
    path = models.CharField(max_length=1000)
    remote_url = models.CharField(max_length=1000, blank=True, default="",
                                  help_text="the git URL it was registered by, if not by path")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "repositories"
        constraints = [
            models.UniqueConstraint(fields=["project", "path"], name="unique_repository_path"),
            models.UniqueConstraint(fields=["project", "name"], name="unique_repository_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.path})"


class Event(models.Model):
    """Append-only record of a state change, streamed live to pages that watch its subject."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="events")
    subject_type = models.CharField(max_length=32)
    subject_id = models.BigIntegerField()
    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["subject_type", "subject_id", "id"]),
            models.Index(fields=["project", "id"]),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind} on {self.subject_type}:{self.subject_id}"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("events are append-only")
        super().save(*args, **kwargs)


class AuditEntry(models.Model):
    """Who did what, when: freezes, approvals, merges, role and token changes."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )
    target = models.CharField(max_length=200, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor_name} {self.action} {self.target}"


class ApiToken(models.Model):
    """A personal token for the CLI and automation; only its SHA-256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=12)
    token_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class WorkerHeartbeat(models.Model):
    """Last time each Celery worker's beat reported in; /api/health reads it."""

    hostname = models.CharField(max_length=255, unique=True)
    last_seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.hostname


class ReceiptQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise ValueError("receipts are immutable once written")


# What a shell's own exit codes mean, so "exit 126" tells a person what to fix.
SHELL_EXIT_HINTS = {126: " (found but not executable: check its mode)", 127: " (command not found)"}


class Receipt(models.Model):
    """What the runtime did and saw: a command, a patch apply, an LLM call, a merge, a review.

    Written once, after the work ended; the evidence a candidate is judged by. Secrets never
    appear here: env values are not stored and declared secret values are redacted from output.
    """

    class Kind(models.TextChoices):
        COMMAND = "command", "command"
        APPLY = "apply", "patch apply"
        EXTRACT = "extract", "patch extract"
        POLICY = "policy", "change policy"
        LLM_CALL = "llm_call", "LLM call"
        MERGE = "merge", "merge"
        REVIEW = "review", "review"
        WEBHOOK = "webhook", "webhook delivery"

    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="receipts"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    subject_type = models.CharField(max_length=32, blank=True)
    subject_id = models.BigIntegerField(null=True, blank=True)
    label = models.CharField(max_length=200, blank=True, help_text="e.g. cand_007 gate 1")
    argv = models.JSONField(default=list, blank=True)
    cwd = models.CharField(max_length=1000, blank=True, help_text="relative to the tree")
    env_names = models.JSONField(default=list, blank=True)
    env_refused = models.JSONField(default=list, blank=True, help_text="secret-like names kept out")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    duration_seconds = models.FloatField()
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    timed_out = models.BooleanField(default=False)
    isolation = models.CharField(max_length=32, blank=True)
    limits = models.JSONField(default=dict, blank=True)
    rusage = models.JSONField(default=dict, blank=True)
    stdout_excerpt = models.TextField(blank=True)
    stdout_bytes = models.BigIntegerField(default=0)
    stdout_sha256 = models.CharField(max_length=64, blank=True)
    stderr_excerpt = models.TextField(blank=True)
    stderr_bytes = models.BigIntegerField(default=0)
    stderr_sha256 = models.CharField(max_length=64, blank=True)
    artifacts = models.JSONField(default=list, blank=True, help_text="[{path, size, sha256}]")
    error = models.TextField(blank=True, help_text="why the work could not run, if it could not")
    detail = models.JSONField(default=dict, blank=True)
    # LLM calls
    requested_model = models.CharField(max_length=200, blank=True)
    resolved_model = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=200, blank=True)
    input_tokens = models.BigIntegerField(null=True, blank=True)
    output_tokens = models.BigIntegerField(null=True, blank=True)
    cache_read_tokens = models.BigIntegerField(null=True, blank=True)
    cache_write_tokens = models.BigIntegerField(null=True, blank=True)
    cost_microusd = models.BigIntegerField(null=True, blank=True)
    price_table_version = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ReceiptQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["subject_type", "subject_id", "id"])]

    def __str__(self) -> str:
        return f"receipt #{self.pk} {self.kind} {self.label}".strip()

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("receipts are immutable once written")
        super().save(*args, **kwargs)

    @property
    def succeeded(self) -> bool:
        return not self.error and not self.timed_out and self.signal is None and self.exit_code == 0

    @property
    def outcome(self) -> str:
        """One phrase a person reads first: passed, exit 3, killed by signal 9, timed out …"""
        if self.error:
            return "did not run"
        if "verdict" in self.detail:
            return self.detail["verdict"]
        if self.detail.get("cancelled"):
            return "cancelled"
        if self.timed_out:
            return "timed out"
        if self.signal:
            return f"killed by signal {self.signal}"
        if self.exit_code is None:
            return "recorded"
        if self.exit_code == 0:
            return "passed"
        return f"exit {self.exit_code}{SHELL_EXIT_HINTS.get(self.exit_code, '')}"

    @property
    def streams(self) -> list[tuple[str, str, int, str]]:
        """(name, excerpt, total bytes, sha256) of stdout and stderr, for templates."""
        return [
            ("stdout", self.stdout_excerpt, self.stdout_bytes, self.stdout_sha256),
            ("stderr", self.stderr_excerpt, self.stderr_bytes, self.stderr_sha256),
        ]

    def as_dict(self) -> dict:
        """The receipt as JSON-ready data, every field, for export and the API."""
        data = {"id": self.pk}
        for item in self._meta.concrete_fields:
            if item.name == "id":
                continue
            value = getattr(self, item.attname)
            data[item.attname] = value.isoformat() if hasattr(value, "isoformat") else value
        data["outcome"] = self.outcome
        return data


class PriceOverride(models.Model):
    """An administrator's price for a model, in place of the shipped price table's."""

    model_prefix = models.CharField(max_length=200, unique=True, help_text="e.g. claude-sonnet-4")
    input = models.FloatField(help_text="USD per million input tokens")
    output = models.FloatField(help_text="USD per million output tokens")
    cache_write = models.FloatField(help_text="USD per million tokens written to the prompt cache")
    cache_read = models.FloatField(help_text="USD per million tokens read from the prompt cache")
    note = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model_prefix"]

    def __str__(self) -> str:
        return f"{self.model_prefix}: {self.input}/{self.output} USD per MTok"


class ProviderKey(models.Model):
    """A provider API key an administrator stored, encrypted (Fernet, keyed from the secret key).

    Used when the workers' environment does not set the variable; shown only by its last four
    characters, never decrypted into a page, a receipt, an event or a log line.
    """

    variable = models.CharField(max_length=64, unique=True, help_text="e.g. ANTHROPIC_API_KEY")
    ciphertext = models.TextField()
    hint = models.CharField(max_length=8, help_text="the key's last four characters")
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["variable"]

    def __str__(self) -> str:
        return f"{self.variable} (…{self.hint})"



class ProviderPreset(models.Model):
    """An administrator's provider preset: a name specs can use for a provider, server, model
    and limits (beside the built-in presets in runtime_app/fleet.py)."""

    class Kind(models.TextChoices):
        ANTHROPIC = "anthropic", "Anthropic"
        BEDROCK = "bedrock", "AWS Bedrock"
        OPENAI_COMPATIBLE = "openai-compatible", "OpenAI-compatible"

    KEY_DEFAULTS = {Kind.ANTHROPIC: "ANTHROPIC_API_KEY", Kind.BEDROCK: "AWS_BEARER_TOKEN_BEDROCK",
                    Kind.OPENAI_COMPATIBLE: "OPENAI_API_KEY"}

    name = models.SlugField(max_length=40, unique=True, help_text="what a spec's worker.provider names")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    model = models.CharField(max_length=200, blank=True, help_text="the model when a spec names none")
    base_url = models.URLField(blank=True, help_text="the provider's server; empty: the kind's default")
    key_variable = models.CharField(
        max_length=64, blank=True, help_text="where its key is: an environment variable or a stored key"
    )
    efforts = models.CharField(
        max_length=80, blank=True,
        help_text="reasoning effort when a spec sets none: one (off, low, medium, high, max) or a "
        "comma-separated list, one per round, the last repeating (e.g. low, medium, high)",
    )
    concurrency = models.PositiveIntegerField(default=4, help_text="model calls in flight for this preset")
    price_model = models.CharField(max_length=200, blank=True,
                                   help_text="the price-table entry (model id prefix) to charge by")
    description = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.name in PRESETS:
            raise ValidationError({"name": f"{self.name!r} is a built-in preset; choose another name."})
        if self.concurrency < 1:
            raise ValidationError({"concurrency": "At least one call in flight."})
        unknown = [effort for effort in self.effort_list() if effort not in EFFORTS]
        if unknown or (self.efforts.strip() and not self.effort_list()):
            raise ValidationError({"efforts": f"Unknown effort {', '.join(unknown) or self.efforts!r}: "
                                   f"use {', '.join(EFFORTS)}, separated by commas."})

    def effort_list(self) -> list[str]:
        return [part.strip() for part in self.efforts.split(",") if part.strip()]

    def as_preset(self):
        return Preset(
            self.name, self.kind, self.description or f"{self.get_kind_display()} preset",
            key_variable=self.key_variable or self.KEY_DEFAULTS[self.kind],
            default_base_url=self.base_url, default_model=self.model, concurrency=self.concurrency,
            price_model=self.price_model, efforts=tuple(self.effort_list()), managed=True,
        )


class NotificationSetting(models.Model):
    """What one person wants to hear about, and whether by email; no row means every default (on)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_setting"
    )
    approval_waiting = models.BooleanField(
        default=True, help_text="a winner I may approve is waiting for a decision"
    )
    search_done = models.BooleanField(
        default=True, help_text="a search I started finished, failed or was cancelled"
    )
    replies = models.BooleanField(default=True, help_text="someone replied where I commented")
    email = models.BooleanField(default=True, help_text="send these by email")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"notifications of {self.user}"


class Webhook(models.Model):
    """A project's outgoing webhook: a Slack-compatible JSON POST, signed with a shared secret.

    The secret is stored encrypted (runtime_app/notifications.py) and never shown again, nor put
    in a payload, an event, a receipt, a log line or a task argument.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=64)
    url = models.CharField(max_length=2000)
    secret_ciphertext = models.TextField()
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_webhook_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.url_shown})"

    @property
    def url_shown(self) -> str:
        """The URL without what may be a credential: scheme, host and port, the path elided
        (a Slack URL's path is its token)."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}/…" if parts.path.strip("/") or parts.query else \
            f"{parts.scheme}://{host}{port}/"


class WebhookDelivery(models.Model):
    """One notification on its way to one webhook: retried with backoff until delivered or out
    of attempts; each attempt writes a receipt (subject "webhook_delivery")."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, help_text="what is POSTed; never a secret")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="when the next attempt is due; a claim moves it by a lease"
    )
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"delivery #{self.pk} of {self.kind} to {self.webhook.name}: {self.state}"


class Invitation(models.Model):
    """An email address asked to join a project with a role; its link carries a random token of
    which only the SHA-256 is stored. The account and membership are made when it is accepted."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        ACCEPTED = "accepted", "accepted"
        REVOKED = "revoked", "revoked"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(help_text="lower-cased")
    role = models.CharField(max_length=16, choices=ProjectRole.choices, default=ProjectRole.VIEWER)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    token_sha256 = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(help_text="when the current link was issued (a resend renews it)")
    sends = models.PositiveIntegerField(default=1)
    expires_at = models.DateTimeField()
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    closed_at = models.DateTimeField(null=True, blank=True, help_text="when it was accepted or revoked")

    class Meta:
        ordering = ["email"]
        constraints = [
            models.UniqueConstraint(fields=["project", "email"], condition=models.Q(state="pending"),
                                    name="one_pending_invitation_per_email")
        ]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.project}"
