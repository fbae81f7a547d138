"""Private directories made without tempfile, with tempfile's rules (and tempfile as the
fallback)."""

from __future__ import annotations

import os
import stat

from agentd.support.tempdirs import private_dir, temp_root


def test_a_private_dir_is_new_owned_and_closed_to_others(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    first, second = private_dir("agentd_"), private_dir("agentd_")
    assert first != second
    for path in (first, second):
        assert os.path.dirname(path) == str(tmp_path)
        assert os.path.basename(path).startswith("agentd_")
        assert len(os.path.basename(path)) == len("agentd_") + 8
        info = os.stat(path)
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
        assert info.st_uid == os.getuid()


def test_the_root_follows_tempfiles_variables_in_order(monkeypatch, tmp_path):
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    assert temp_root() == "/tmp"
    monkeypatch.setenv("TMP", str(tmp_path / "tmp"))
    assert temp_root() == str(tmp_path / "tmp")
    monkeypatch.setenv("TEMP", "relative")
    assert temp_root() == os.path.abspath("relative")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert temp_root() == str(tmp_path)


def test_a_folder_that_cannot_hold_it_falls_back_to_tempfile(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where tempfile would go
    path = private_dir("agentd_")
    assert os.path.dirname(path) == str(tmp_path)
    assert os.path.basename(path).startswith("agentd_") and os.path.isdir(path)
