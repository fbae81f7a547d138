"""The guardian removes only what is surely the agent's: a directory named agentd-* that
holds nothing but named pipes (and maybe the drain control file); and it releases a dead
agent's membership only once its workers are dead."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from agentd.hygiene.guardian_process import (
    CONTROL_FILE,
    remove_private_dir,
    remove_secret_file,
    wait_dead,
)
from agentd.wire import control


def test_a_pipe_directory_is_removed(tmp_path):
    pipes = tmp_path / "agentd-timer-abc"
    pipes.mkdir()
    os.mkfifo(pipes / "timer.fifo")
    remove_private_dir(str(pipes))
    assert not pipes.exists()


def test_a_pipe_directory_holding_the_drain_control_file_is_removed(tmp_path):
    """Where the log disk could not have it, the agent makes its control file there."""
    pipes = tmp_path / "agentd-timer-abc"
    pipes.mkdir()
    os.mkfifo(pipes / "timer.fifo")
    control.create(str(pipes / control.NAME))
    assert control.NAME == CONTROL_FILE  # the guardian imports nothing of agentd's
    remove_private_dir(str(pipes))
    assert not pipes.exists()


def test_a_control_file_that_is_no_file_is_left_alone(tmp_path):
    pipes = tmp_path / "agentd-timer-abc"
    (pipes / control.NAME).mkdir(parents=True)
    remove_private_dir(str(pipes))
    assert (pipes / control.NAME).is_dir()


def test_anything_else_is_left_alone(tmp_path):
    other = tmp_path / "agentd-timer-xyz"
    other.mkdir()
    os.mkfifo(other / "timer.fifo")
    (other / "notes.txt").write_text("not ours to delete")
    remove_private_dir(str(other))
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt", "timer.fifo"]
    named = tmp_path / "mine"
    named.mkdir()
    os.mkfifo(named / "timer.fifo")
    remove_private_dir(str(named))
    assert named.exists()
    remove_private_dir(str(tmp_path / "agentd-gone"))  # missing: nothing to do, no error


def test_a_secret_file_is_removed_only_while_it_holds_the_secret(tmp_path):
    digest = hashlib.sha256(b"ours").hexdigest()
    ours = tmp_path / "store-1.token"
    ours.write_text("ours")
    remove_secret_file(str(ours), digest)
    assert not ours.exists()
    newer = tmp_path / "store-2.token"
    newer.write_text("a newer agent's")  # published over ours after we were told of it
    remove_secret_file(str(newer), digest)
    assert newer.read_text() == "a newer agent's"
    link = tmp_path / "store-3.token"
    link.symlink_to(ours.with_name("elsewhere"))
    ours.with_name("elsewhere").write_text("ours")
    remove_secret_file(str(link), digest)  # never followed
    assert link.is_symlink()
    remove_secret_file(str(tmp_path / "gone.token"), digest)  # missing: no error


def test_a_will_waits_for_running_workers_but_not_for_zombies():
    """A killed worker nobody has reaped yet (its agent is dead) is a zombie: it runs
    nothing, though ``killpg(pgid, 0)`` still finds its group."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        assert not wait_dead({sleeper.pid}, "no-such-mark", 0.2)
        sleeper.kill()
        os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
        assert wait_dead({sleeper.pid}, "no-such-mark", 2.0)
    finally:
        sleeper.kill()
        sleeper.wait()
