"""The measurement lane: a trial holds it alone, every other command on the host shares it."""

import threading

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from runtime_app import lane, sandbox
from runtime_app.lane import EXCLUSIVE, SHARED, PageReadsMiddleware, git_held, lane_hold, page_reads
from runtime_app.worktrees import git_run


def _in_thread(target) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run():
        target()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_a_git_call_waits_while_a_trial_holds_the_lane(tmp_path):
    with lane_hold(EXCLUSIVE):
        thread, done = _in_thread(lambda: git_run(["--version"], cwd=tmp_path))
        assert not done.wait(0.5), "git ran while a timing trial held the lane alone"
    thread.join(60)
    assert done.is_set()


def test_a_thread_holding_the_lane_shared_may_take_it_again_without_waiting_for_itself(tmp_path):
    def nested():
        with lane_hold(SHARED), lane_hold(SHARED):
            git_run(["--version"], cwd=tmp_path)

    thread, done = _in_thread(nested)
    thread.join(60)
    assert done.is_set()


def test_a_thread_holding_the_lane_exclusive_runs_its_own_git_calls(tmp_path):
    with lane_hold(EXCLUSIVE):
        assert git_run(["--version"], cwd=tmp_path).startswith(b"git version")


def test_a_thread_holding_the_lane_shared_cannot_take_it_exclusive():
    with lane_hold(SHARED), pytest.raises(RuntimeError, match="wait for itself"), lane_hold(EXCLUSIVE):
        pass


def test_a_pages_git_read_passes_while_a_trial_holds_the_lane(tmp_path):
    def page_read():
        with page_reads():
            git_run(["--version"], cwd=tmp_path)

    with lane_hold(EXCLUSIVE):
        thread, done = _in_thread(page_read)
        assert done.wait(60), "a page's git read waited for a timing trial"
    thread.join(60)


@pytest.mark.parametrize(("method", "skips"), [("GET", True), ("HEAD", True), ("POST", False)])
def test_only_a_get_or_head_request_reads_git_without_the_lane(method, skips):
    seen = []

    def view(request):
        with git_held():
            seen.append(getattr(lane._held, "mode", None))
        return HttpResponse()

    PageReadsMiddleware(view)(RequestFactory().generic(method, "/"))
    assert seen == [None if skips else SHARED]


def test_a_sandboxed_command_takes_the_lane_even_for_a_page(tmp_path):
    with page_reads(), lane_hold(EXCLUSIVE):
        thread, done = _in_thread(lambda: sandbox.run(["true"], cwd=tmp_path, timeout=30))
        assert not done.wait(0.5), "a sandboxed command ran while a timing trial held the lane alone"
    thread.join(60)
    assert done.is_set()
