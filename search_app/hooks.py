"""How search_app plugs into the runtime: its subjects, its project section, its live fragments,
the approvals it withdraws and the notifications it sends. SearchAppConfig.ready() imports this
module (it imports models, so not before the app registry is ready) and calls connect()."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.signals import worker_ready
from django.db import connection
from django.db.models.signals import post_save

from runtime_app.models import Event
from runtime_app.signals import approver_standing_ended
from runtime_app.subjects import (
    live_renderer_register,
    project_section_register,
    subject_label_register,
    subject_type_register,
)
from runtime_app.waiting import waiting_register
from search_app import notifications
from search_app.execution import parked_trees_sweep
from search_app.live import search_live_fragments
from search_app.models import Candidate, Comment, Search
from search_app.selectors import project_searches_section
from search_app.services import approvals_withdraw
from search_app.waiting import EVENT_KINDS as WAITING_EVENT_KINDS
from search_app.waiting import search_waiting

logger = logging.getLogger(__name__)
# How often a worker host removes the evaluation trees it parked that no trial will take.
PARKED_TREES_SWEEP_SECONDS = 10.0


def approvals_withdraw_for(sender: Any, user: Any, project: Any, actor: Any, reason: str,
                           **kwargs: Any) -> None:
    approvals_withdraw(actor, user, project=project, reason=reason)


def search_project(subject_id: int) -> int | None:
    return Search.objects.filter(pk=subject_id).values_list("project_id", flat=True).first()


def candidate_project(subject_id: int) -> int | None:
    found = Candidate.objects.filter(pk=subject_id).values_list("search__project_id", flat=True)
    return found.first()


def searches_section(user: Any, project: Any) -> Any:
    return project_searches_section(user, project)


def search_labels(ids: list[int]) -> dict[int, str]:
    return dict(Search.objects.filter(pk__in=ids).values_list("pk", "search_id"))


def candidate_labels(ids: list[int]) -> dict[int, str]:
    return {pk: f"{candidate_id} of {search_id}" for pk, candidate_id, search_id in Candidate.objects
            .filter(pk__in=ids).values_list("pk", "candidate_id", "search__search_id")}


def connect() -> None:
    subject_label_register("search", search_labels)
    subject_label_register("candidate", candidate_labels)
    subject_type_register("search", search_project)
    project_section_register("searches", 10, searches_section)
    subject_type_register("candidate", candidate_project)
    live_renderer_register("search", search_live_fragments)
    waiting_register("searches", search_waiting, WAITING_EVENT_KINDS)
    # Someone who may no longer decide (left the project, lost the approve permission):
    # their pending decisions on unmerged winners are withdrawn.
    approver_standing_ended.connect(approvals_withdraw_for, weak=False,
                                    dispatch_uid="search_app_approvals_withdraw")
    # Notifications (search_app/notifications.py): a winner awaiting approval, a search that
    # finished or was cancelled, a comment; each once its change commits.
    post_save.connect(notifications.event_saved, sender=Event, dispatch_uid="search_app_notify_events")
    post_save.connect(notifications.comment_saved, sender=Comment, dispatch_uid="search_app_notify_comments")
    worker_ready.connect(parked_trees_sweeper_start, weak=False,
                         dispatch_uid="search_app_parked_trees_sweeper")


def parked_trees_sweeper_start(**kwargs: Any) -> None:
    """Each worker host sweeps its own parked evaluation trees (search_app.execution): the trials
    of a tree it parked may run on another host, and then nothing else would remove it."""
    threading.Thread(target=_parked_trees_sweep_forever, name="crucible-parked-trees", daemon=True).start()


def _parked_trees_sweep_forever() -> None:
    while True:
        time.sleep(PARKED_TREES_SWEEP_SECONDS)
        try:
            parked_trees_sweep()
        except Exception:  # a sweep that fails leaves trees for the next one; the worker goes on
            logger.exception("could not sweep the parked evaluation trees")
        finally:
            connection.close()  # no database connection held between sweeps
