"""Specs (drafts with versions) and frozen searches."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runtime_app.models import Project, Repository
from runtime_app.presenters import NAME_MAX_LENGTH, short_sha


class Spec(models.Model):
    """A draft a person edits; every saved text is kept as a SpecVersion."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="specs")
    title = models.CharField(max_length=NAME_MAX_LENGTH)
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
    name = models.CharField(max_length=NAME_MAX_LENGTH)
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
    contract = models.PositiveSmallIntegerField(
        default=3,
        help_text="how it runs: 1 = absolute medians (frozen before paired blocks), 2 = paired, "
                  "3 = paired, and a reviewer's reject blocks a winner unless the spec says advisory")
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


class SearchRun(models.Model):
    """The running state of a frozen search: status, round, budget and outcome."""

    class Status(models.TextChoices):
        RUNNING = "running", "running"
        CANCELLING = "cancelling", "cancelling"
        CANCELLED = "cancelled", "cancelled"
        FINISHED = "finished", "finished"

    class Phase(models.TextChoices):
        ROUNDS = "rounds", "rounds"
        REPLAY = "replay", "replay"
        REVIEW = "review", "review"
        REVISE = "revise", "revise"  # a person sent the winner back to its writer
        DONE = "done", "done"

    # The answer of a search whose every candidate failed.
    NONE = "NONE"
    # The answer of a search that found one.
    WINNER = "winner"

    search = models.OneToOneField(Search, on_delete=models.CASCADE, related_name="run")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    outcome = models.CharField(max_length=8, blank=True, help_text="winner or NONE once finished")
    winner = models.ForeignKey(
        "Candidate", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.ROUNDS)
    round_index = models.PositiveIntegerField(default=0)
    rankings = models.JSONField(default=dict, blank=True, help_text="{round: [candidate ids, best first]}")
    replayed = models.JSONField(default=list, blank=True, help_text="candidate ids replayed, in order")
    budget_cost_microusd = models.BigIntegerField(null=True, blank=True)
    budget_tokens = models.BigIntegerField(null=True, blank=True)
    reserved_cost_microusd = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    spent_cost_microusd = models.BigIntegerField(default=0)
    spent_tokens = models.BigIntegerField(default=0)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    drive_enqueued_at = models.DateTimeField(
        null=True, blank=True, help_text="a search_drive handed to the broker and not started yet")

    def __str__(self) -> str:
        return f"run of {self.search.search_id}: {self.status} {self.outcome}".strip()

    @property
    def terminal(self) -> bool:
        return self.status in (self.Status.CANCELLED, self.Status.FINISHED)


class Candidate(models.Model):
    """One writer's attempt: its patch, how far it got, its scores and why it fell."""

    class State(models.TextChoices):
        QUEUED = "queued", "queued"
        WRITING = "writing", "writing"
        EVALUATING = "evaluating", "evaluating"
        ALIVE = "alive", "alive"
        ELIMINATED = "eliminated", "eliminated"
        NOT_ADMITTED = "not_admitted", "not admitted"
        WINNER = "winner", "winner"
        CANCELLED = "cancelled", "cancelled"

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="candidates")
    candidate_id = models.CharField(max_length=16)
    number = models.PositiveIntegerField()
    batch = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    round_reached = models.IntegerField(default=-1, help_text="last round it was evaluated in")
    patch = models.BinaryField(default=b"", blank=True)
    patch_sha256 = models.CharField(max_length=64, blank=True)
    patch_round = models.IntegerField(default=0, help_text="the round whose writer wrote the current patch")
    diff_lines = models.IntegerField(null=True, blank=True)
    files = models.JSONField(default=list, blank=True)
    gates_passed = models.IntegerField(default=0)
    score = models.FloatField(
        null=True, blank=True,
        help_text="its latest round's figure: the median paired ratio to the baseline (paired), or the "
                  "median of its trials (absolute)")
    score_low = models.FloatField(null=True, blank=True, help_text="its confidence interval's low end")
    score_high = models.FloatField(null=True, blank=True, help_text="its confidence interval's high end")
    score_absolute = models.FloatField(null=True, blank=True, help_text="median of its latest round's trials")
    spread = models.FloatField(null=True, blank=True, help_text="max − min of those trials")
    trials = models.JSONField(default=dict, blank=True, help_text="{round: [values, in block order]}")
    blocks = models.JSONField(default=dict, blank=True, help_text="{round: {block: value}}")
    runtime_seconds = models.FloatField(null=True, blank=True, help_text="mean trial wall time")
    cost_microusd = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    reason = models.TextField(blank=True, help_text="why it fell, or why it went on")
    duplicate_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["search", "number"]
        constraints = [
            models.UniqueConstraint(fields=["search", "candidate_id"], name="unique_candidate_id")
        ]
        # The planner's lookups: the next candidates by state, and identical patches by hash.
        indexes = [
            models.Index(fields=["search", "state", "number"]),
            models.Index(fields=["search", "patch_sha256"]),
        ]

    def __str__(self) -> str:
        return f"{self.candidate_id} ({self.state})"


class Step(models.Model):
    """A unit of work (generate, evaluate, replay, review): claimed by lease, done once."""

    class Kind(models.TextChoices):
        GENERATE = "generate", "generate"
        EVALUATE = "evaluate", "evaluate"
        MEASURE = "measure", "measure"
        REPLAY = "replay", "replay"
        REVIEW = "review", "review"

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        DONE = "done", "done"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="steps")
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="steps")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    round = models.IntegerField(default=0)
    part = models.IntegerField(default=0, help_text="a round's measurements: its blocks, then adaptive ones")
    plan = models.JSONField(default=dict, blank=True, help_text="measure/replay: members, blocks")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="last handed to the broker")
    reserved_cost_microusd = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["candidate", "kind", "round", "part"], name="unique_step_part")
        ]
        indexes = [
            models.Index(fields=["search", "state"]), models.Index(fields=["state", "lease_expires_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.candidate.candidate_id} r{self.round} ({self.state})"

    @property
    def refines(self) -> bool:
        """A writer step after round 0: the candidate's writer revising its own patch."""
        return self.kind == self.Kind.GENERATE and self.round > 0


class Review(models.Model):
    """An independent read-only reviewer's verdict on a candidate; it never approves a merge."""

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="reviews")
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="reviews")
    class Verdict(models.TextChoices):
        APPROVE = "approve", "approve"
        REJECT = "reject", "reject"

    verdict = models.CharField(max_length=8, choices=Verdict.choices)
    findings = models.JSONField(default=list, blank=True)
    reviewer = models.CharField(max_length=200)
    receipt = models.ForeignKey(
        "runtime_app.Receipt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"review of {self.candidate.candidate_id}: {self.verdict}"


class Comment(models.Model):
    """A person's remark on a candidate. A top-level comment starts a thread (on the candidate,
    one file, or one line of its patch); replies belong to a thread and have no place of their own.

    A line comment is anchored to (path, side, line): side old is the file before the patch (a
    deleted or context line), new the file after it. It keeps the patch hash it was made on and
    the text of its line, so a later refinement of the patch can show it as outdated
    (selectors.candidate_threads) without losing it.
    """

    class State(models.TextChoices):
        OPEN = "open", "open"
        RESOLVED = "resolved", "resolved"

    class Side(models.TextChoices):
        OLD = "old", "old"
        NEW = "new", "new"

    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="comments")
    reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies",
        help_text="the thread (a top-level comment) this reply belongs to")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    author_name = models.CharField(max_length=150)
    path = models.CharField(max_length=400, blank=True)
    line = models.PositiveIntegerField(null=True, blank=True)
    side = models.CharField(max_length=3, choices=Side.choices, default=Side.NEW,
                            help_text="a line thread's side of the diff: old (before the patch: deleted "
                                      "and context lines) or new (after it)")
    body = models.TextField()
    patch_sha256 = models.CharField(max_length=64, blank=True, help_text="the patch it was made on")
    line_text = models.TextField(blank=True, help_text="the anchored line as the diff showed it then")
    state = models.CharField(max_length=8, choices=State.choices, default=State.OPEN,
                             help_text="a thread's: open or resolved (a reply's stays open)")
    state_changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state_changed_by_name = models.CharField(max_length=150, blank=True,
                                             help_text="who last resolved or reopened the thread")
    state_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.author_name} on {self.candidate.candidate_id}"

    @property
    def is_thread(self) -> bool:
        return self.reply_to_id is None


class Approval(models.Model):
    """A person's decision on a winner, bound to the exact patch it was made on.

    A decision made on another patch hash than the candidate's current one is stale: it
    counts for nothing. The latest decision of each person is the one that stands. A
    decision is withdrawn (for good) when its maker leaves the project or loses the approve
    permission before the winner is merged.
    """

    class Decision(models.TextChoices):
        APPROVE = "approve", "approve"
        REQUEST_CHANGES = "request_changes", "request changes"

    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="approvals")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    user_name = models.CharField(max_length=150)
    decision = models.CharField(max_length=16, choices=Decision.choices)
    patch_sha256 = models.CharField(max_length=64)
    replay = models.TextField(blank=True, help_text="the replay result shown when deciding")
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    withdrawn_at = models.DateTimeField(null=True, blank=True)
    withdrawn_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return (f"{self.user_name} {self.decision} {self.candidate.candidate_id} "
                f"@ {short_sha(self.patch_sha256)}")

    @property
    def stale(self) -> bool:
        return self.patch_sha256 != self.candidate.patch_sha256


class Merge(models.Model):
    """The one commit a search's approved winner became: on a new branch or an existing one."""

    class Target(models.TextChoices):
        NEW_BRANCH = "new_branch", "new branch"
        EXISTING_BRANCH = "existing_branch", "existing branch"

    search = models.OneToOneField(Search, on_delete=models.CASCADE, related_name="merge")
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="+")
    target = models.CharField(max_length=16, choices=Target.choices)
    branch = models.CharField(max_length=255)
    commit_sha = models.CharField(max_length=40)
    patch_sha256 = models.CharField(max_length=64)
    merged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    merged_by_name = models.CharField(max_length=150)
    receipt = models.ForeignKey(
        "runtime_app.Receipt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.search.search_id} → {self.branch} @ {short_sha(self.commit_sha)}"


class HiddenFile(models.Model):
    """A hidden evaluator file read from the host at freeze: the bytes every evaluation tree of
    its search receives, whatever happens on the host later. Never shown to writers; pages show
    its path, hash and size only."""

    search = models.ForeignKey(Search, on_delete=models.CASCADE, related_name="hidden_files")
    path = models.CharField(max_length=1000, help_text="where it lands in the evaluation tree")
    source = models.CharField(max_length=2000, help_text="the host path it was read from")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    executable = models.BooleanField(default=False)
    content = models.BinaryField()

    class Meta:
        ordering = ["search", "path"]
        constraints = [models.UniqueConstraint(fields=["search", "path"], name="unique_hidden_file")]

    def __str__(self) -> str:
        return f"{self.search.search_id} {self.path} ({self.size} bytes)"

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:
            raise ValueError("a hidden file's snapshot is immutable, like its search")
        super().save(*args, **kwargs)
