"""The guardian removes only what is surely the agent's: a directory named agentd-* that
holds nothing but named pipes."""

from __future__ import annotations

import os

from agentd.hygiene.guardian_process import remove_private_dir


def test_a_pipe_directory_is_removed(tmp_path):
    pipes = tmp_path / "agentd-timer-abc"
    pipes.mkdir()
    os.mkfifo(pipes / "timer.fifo")
    remove_private_dir(str(pipes))
    assert not pipes.exists()


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
