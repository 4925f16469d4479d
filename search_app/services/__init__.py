"""Every write in search_app, by lifecycle: spec drafts and versions (`specs`), freezing a spec
into a search (`freeze`), starting, planning and ending a search run (`runs`), step leases and
step results (`steps`), revising a winner (`revisions`), and comments, approval and merge
(`decisions`). Callers use the package: `from search_app import services; services.x(...)`."""

from search_app.measurement import MAX_REPLAYS
from search_app.services._common import comparison_for, review_blocks
from search_app.services.decisions import (
    MAX_BRANCH_CHARS,
    MAX_COMMENT_CHARS,
    VALID_BRANCH_HINT,
    Conflict,
    PatchMismatch,
    approval_record,
    approvals_withdraw,
    branch_name_check,
    comment_add,
    merge_branch_default,
    merge_create,
    thread_reopen,
    thread_resolve,
)
from search_app.services.freeze import search_freeze, spec_draft_freeze
from search_app.services.revisions import REVISION_PART, search_revise
from search_app.services.runs import (
    ProviderUnready,
    search_advance,
    search_cancel,
    search_run_inline,
    search_start,
    search_start_checked,
)
from search_app.services.specs import (
    DRAFT_INSTRUCTIONS,
    spec_create,
    spec_draft_save,
    spec_draft_write,
    spec_duplicate,
    spec_save,
)
from search_app.services.steps import (
    MAX_ATTEMPTS,
    search_drive_request,
    search_drive_started,
    step_claim,
    step_execute,
    steps_enqueue_mark,
    steps_reconcile,
)

__all__ = [
    "DRAFT_INSTRUCTIONS",
    "MAX_ATTEMPTS",
    "MAX_BRANCH_CHARS",
    "MAX_COMMENT_CHARS",
    "MAX_REPLAYS",
    "REVISION_PART",
    "VALID_BRANCH_HINT",
    "Conflict",
    "PatchMismatch",
    "ProviderUnready",
    "approval_record",
    "approvals_withdraw",
    "branch_name_check",
    "comment_add",
    "comparison_for",
    "merge_branch_default",
    "merge_create",
    "review_blocks",
    "search_advance",
    "search_cancel",
    "search_drive_request",
    "search_drive_started",
    "search_freeze",
    "search_revise",
    "search_run_inline",
    "search_start",
    "search_start_checked",
    "spec_create",
    "spec_draft_freeze",
    "spec_draft_save",
    "spec_draft_write",
    "spec_duplicate",
    "spec_save",
    "step_claim",
    "step_execute",
    "steps_enqueue_mark",
    "steps_reconcile",
    "thread_reopen",
    "thread_resolve",
]
