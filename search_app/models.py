"""Specs (drafts with versions) and frozen searches."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime_app.models import Project, Repository


class Spec(models.Model):
    """A draft a person edits; every saved text is kept as a SpecVersion."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="specs")
    title = models.CharField(max_length=96)
    duplicated_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="duplicates"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title

    @property
    def latest(self) -> SpecVersion | None:
        return self.versions.order_by("-number").first()


class SpecVersion(models.Model):
    """One saved text of a spec; never changed after it is written."""

    spec = models.ForeignKey(Spec, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    text = models.TextField()
    valid = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["spec", "number"]
        constraints = [
            models.UniqueConstraint(fields=["spec", "number"], name="unique_spec_version")
        ]

    def __str__(self) -> str:
        return f"{self.spec} v{self.number}"


class Search(models.Model):
    """A frozen spec: baseline commit, model ids and hashes. Immutable once written."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="searches")
    search_id = models.CharField(max_length=40, unique=True)
    preregistration_hash = models.CharField(max_length=64)
    spec_version = models.ForeignKey(
        SpecVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="searches"
    )
    repository = models.ForeignKey(
        Repository, null=True, blank=True, on_delete=models.SET_NULL, related_name="searches"
    )
    repository_path = models.CharField(max_length=1000)
    ref = models.CharField(max_length=255)
    name = models.CharField(max_length=96)
    objective = models.TextField()
    baseline_commit = models.CharField(max_length=40)
    requested_model_id = models.CharField(max_length=200)
    resolved_model_id = models.CharField(max_length=200)
    model_resolution = models.CharField(max_length=32)
    public_evidence_hash = models.CharField(max_length=64)
    evaluator_hash = models.CharField(max_length=64)
    spec_text = models.TextField()
    spec_normalized = models.JSONField()
    hashed_inputs = models.JSONField()
    candidate_batches = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "searches"

    def __str__(self) -> str:
        return f"{self.search_id} {self.name}"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("a frozen search is immutable; changing anything means a new search")
        super().save(*args, **kwargs)
