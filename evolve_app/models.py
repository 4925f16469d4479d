"""Agent evolution: workspaces registered as agents, evolution runs, their cycles and observations.

The workspace's files and their git tags (`evo-0`, `pre-evo-N`, `evo-N`) are the truth about
the agent; these rows record what each cycle measured and decided, and where observations go
(outside the workspace's git history).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse

from runtime_app.models import Project
from runtime_app.presenters import NAME_MAX_LENGTH


class Agent(models.Model):
    """An agent workspace (a folder under git) imported into a project."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=NAME_MAX_LENGTH)
    path = models.CharField(max_length=1000, unique=True)
    # The folder it was imported from, when `path` is Crucible's own copy of it (import never
    # writes into the user's folder); blank for agents imported in place before copies existed.
    source_path = models.CharField(max_length=1000, blank=True)
    agent_type = models.CharField(max_length=64, blank=True)
    # What the import found, shown on the agent page, the API and the CLI: the inferred manifest
    # and its reasoning, and each file Crucible will not use with the reason ({path, message, kind}).
    import_warnings = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    # Set (never stored) on the agent an import returns when the folder was already imported.
    import_note: str = ""

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class EvolutionRun(models.Model):
    """One `Evolver(agent, benchmark, config).run(cycles=N)`."""

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RUNNING = "running", "running"
        AWAITING_REVIEW = "awaiting_review", "awaiting review"
        FINISHED = "finished", "finished"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    # The states a run is still going in: one at a time per agent.
    class Driver(models.TextChoices):
        WORKER = "worker", "a worker"
        SCRIPT = "script", "a Python script"

    ACTIVE = (Status.QUEUED, Status.RUNNING, Status.AWAITING_REVIEW)

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="runs")
    # What people call it: the agent's first, second … run ("run 3"), never the database id.
    number = models.PositiveIntegerField(default=0)
    benchmark = models.CharField(max_length=500, help_text="a registered name, folder:PATH or jsonl:PATH")
    engine = models.CharField(max_length=200, help_text="an engine name or a dotted path")
    # The worker names engines, agents and benchmarks with this trust: a dotted path needs it
    # (or CRUCIBLE_ALLOWED_EXTENSIONS), so a row edited later cannot smuggle an import.
    trusted = models.BooleanField(default=False, help_text="started from the local administrator's CLI, "
                                                           "which may name dotted paths")
    config = models.JSONField(default=dict, blank=True)
    # Who drives the cycles: a worker (queued by the page, API or CLI; handed on if it dies) or the
    # Python script that made it (crucible.aevolve: its objects live in that process only, so a
    # lost script fails the run instead of handing it to a worker that cannot rebuild them).
    driver = models.CharField(max_length=16, choices=Driver.choices, default=Driver.WORKER)
    # What the workspace's agent ran as when the run was requested (evolve_app.agents.agent_mapping):
    # an A-Evolve agent stood in for by the reference agent, its tools' sandboxed equivalents.
    agent_mapping = models.JSONField(default=dict, blank=True)
    cycles_planned = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    converged = models.BooleanField(default=False)
    reason = models.TextField(blank=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A worker holds a running run by a lease it renews; the reconciler hands a run on when the
    # lease passes (its worker died) or its message never reached a worker.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["agent", "number"],
                                               name="evolution_run_number_per_agent")]

    def __str__(self) -> str:
        return f"{self.agent} run {self.number} ({self.status})"

    def get_absolute_url(self) -> str:
        """The run's page, named by the agent's own run number (as its title is)."""
        return reverse("evolution_run_detail", args=[self.agent_id, self.number])


class Cycle(models.Model):
    """One cycle: solve, evaluate, `pre-evo-N`, engine step, `evo-N`, and what that changed."""

    class Status(models.TextChoices):
        SOLVING = "solving", "solving"
        EVOLVING = "evolving", "evolving"
        AWAITING_REVIEW = "awaiting_review", "awaiting review"
        ACCEPTED = "accepted", "accepted"
        REJECTED = "rejected", "rejected"
        FAILED = "failed", "failed"

    run = models.ForeignKey(EvolutionRun, on_delete=models.CASCADE, related_name="cycles")
    number = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SOLVING)
    score = models.FloatField(null=True, blank=True, help_text="mean train score of the batch")
    holdout_score = models.FloatField(null=True, blank=True)
    holdout_after = models.FloatField(null=True, blank=True, help_text="holdout score of the mutation")
    mutated = models.BooleanField(default=False)
    summary = models.TextField(blank=True)
    engine_metadata = models.JSONField(default=dict, blank=True)
    skills_added = models.JSONField(default=list, blank=True)
    skills_modified = models.JSONField(default=list, blank=True)
    skills_deleted = models.JSONField(default=list, blank=True)
    prompt_size_change = models.IntegerField(default=0)
    reverted_paths = models.JSONField(default=list, blank=True, help_text="edits outside evolvable_layers")
    pre_commit = models.CharField(max_length=40, blank=True)
    post_commit = models.CharField(max_length=40, blank=True)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="unique_cycle_number")]

    def __str__(self) -> str:
        return f"cycle {self.number} of run {self.run.number} ({self.status})"


class ObservationRecord(models.Model):
    """One (task, trajectory, feedback) of a cycle, in the seed's observation format."""

    class Split(models.TextChoices):
        TRAIN = "train", "train"
        HOLDOUT = "holdout", "holdout"

    cycle = models.ForeignKey(Cycle, on_delete=models.CASCADE, related_name="observations")
    split = models.CharField(max_length=16, choices=Split.choices, default=Split.TRAIN)
    task_id = models.CharField(max_length=200)
    task_input = models.TextField()
    agent_output = models.TextField(blank=True)
    steps = models.JSONField(default=list, blank=True)
    success = models.BooleanField()
    score = models.FloatField()
    feedback_detail = models.TextField(blank=True)

    class Meta:
        ordering = ["cycle", "id"]

    def __str__(self) -> str:
        return f"{self.task_id}: {'success' if self.success else 'failure'} ({self.score:g})"

    def as_record(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "task_input": self.task_input, "agent_output": self.agent_output,
                "steps": self.steps, "success": self.success, "score": self.score,
                "feedback_detail": self.feedback_detail}
