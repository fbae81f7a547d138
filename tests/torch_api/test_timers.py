"""Timer servers built by the user, as torch's own timer tests and examples build them."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import time
import uuid

import pytest

from tests.torch_api.conftest import RUNS_SCRIPTS, elastic, run_script

pytestmark = RUNS_SCRIPTS


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_local_timer_server_kills_the_users_expired_children(impl, start_method):
    """The children share the server's process group: only the expired pid is killed."""
    out = run_script(impl, "mp_timers.py", start_method)
    assert out["exitcodes"] == [-signal.SIGKILL, 0]


def test_the_request_queue_gives_what_arrives_within_the_timeout(impl):
    timer = elastic(impl, "timer")
    local = elastic(impl, "timer.local_timer")
    queue = mp.Queue()
    requests = local.MultiprocessingRequestQueue(queue)
    assert requests.get(1, timeout=0.01) == []
    request = timer.TimerRequest(1, "scope", 0)
    queue.put(request)
    assert requests.get(2, timeout=0.5) == [request]


def _hold_a_timer_and_exit(path: str) -> None:
    elastic_timer = elastic(os.environ["IMPL"], "timer")
    elastic_timer.FileTimerClient(path).acquire("scope", time.time() + 0.2)


def test_a_file_timer_of_a_process_that_exited_is_dropped_not_reaped(impl, monkeypatch):
    timer = elastic(impl, "timer")
    path = f"/tmp/agentd-test-timer-{uuid.uuid4().hex}"
    server = timer.FileTimerServer(path, "run", max_interval=0.01)
    server.start()
    try:
        monkeypatch.setenv("IMPL", impl)
        proc = mp.get_context("fork").Process(target=_hold_a_timer_and_exit, args=(path,))
        proc.start()
        proc.join(30)
        time.sleep(0.3)  # the timer expires after its owner is gone
        server.run_once()
        assert proc.exitcode == 0 and len(server._timers) == 0
    finally:
        server.stop()
    assert not os.path.exists(path)


def test_a_file_timer_client_without_a_server_is_a_broken_pipe(impl, tmp_path):
    timer = elastic(impl, "timer")
    client = timer.FileTimerClient(str(tmp_path / "nobody"))
    with pytest.raises(BrokenPipeError):
        client.acquire("scope", time.time() + 1)


def test_a_reap_that_fails_is_retried_at_the_next_pass(impl):
    """A hung worker whose first reap failed (``_reap_worker`` returned False: torch's own
    catches the kill's error) is reaped at the next watchdog pass, never forgotten."""
    timer = elastic(impl, "timer")
    local = elastic(impl, "timer.local_timer")

    class FailsOnce(local.LocalTimerServer):
        failed = False

        def _reap_worker(self, worker_id, *args):
            if not self.failed:
                self.failed = True
                return False
            return super()._reap_worker(worker_id, *args)

    hung = subprocess.Popen(["sleep", "60"], start_new_session=True)
    server = FailsOnce(mp.Queue(), max_interval=0.01)
    try:
        server.register_timers([timer.TimerRequest(hung.pid, "step", time.time() - 1)])
        server._run_watchdog()
        assert server.failed and hung.poll() is None and len(server._timers) == 1
        server._run_watchdog()
        assert hung.wait(timeout=10) == -signal.SIGKILL
        assert len(server._timers) == 0
    finally:
        hung.kill()
        hung.wait()


def test_a_file_timer_servers_last_progress_is_recent_while_it_serves(impl):
    """``get_last_progress_time()`` is the alive callback torch's agent gives its health
    check server (``HealthCheckServer(server.get_last_progress_time, port, timeout)``):
    whole epoch seconds, recent before and while the watchdog serves a client. Recent, not
    now: torch's stays at its last pass, and a loaded machine (CI, 2026-12-01) ran none
    between the client's late open (torch's client retries it) and ``run_once``, so it
    was the server's start, 3.4 s before."""
    timer = elastic(impl, "timer")
    path = f"/tmp/agentd-test-timer-{uuid.uuid4().hex}"
    server = timer.FileTimerServer(path, "run", max_interval=0.1)
    before = server.get_last_progress_time()
    assert isinstance(before, int) and abs(before - time.time()) <= 1
    server.start()
    try:
        timer.FileTimerClient(path).acquire("scope", time.time() + 60)
        server.run_once()  # the request is read: the client has started
        progress = server.get_last_progress_time()
        assert isinstance(progress, int) and before <= progress <= time.time()
    finally:
        server.stop()
