"""The control file a drain is published through: made fresh for each attempt, in place,
so a worker that maps it (a kept one) reads the reset and never a shorter file."""

from __future__ import annotations

from agentd.wire import control


def test_each_attempt_resets_the_file_in_place(tmp_path):
    path = str(tmp_path / "drain.control")
    control.create(path)
    view = control.ControlView(path)
    assert view.read() == (0, control.NO_STEP)
    control.publish(path, 3, 120)
    assert view.read() == (3, 120)
    control.create(path)  # the next attempt: the mapped view sees the reset
    assert view.read() == (0, control.NO_STEP)
    assert (tmp_path / "drain.control").stat().st_size == control.SIZE


def test_a_file_of_another_size_is_made_the_right_size(tmp_path):
    path = tmp_path / "drain.control"
    path.write_bytes(b"x" * 100)
    control.create(str(path))
    assert path.stat().st_size == control.SIZE
    assert control.ControlView(str(path)).read() == (0, control.NO_STEP)
