"""A spare's script compiled ahead is used only for that file, unchanged."""

from __future__ import annotations

from agentd.preload.spare import ScriptAhead


def test_the_code_compiled_ahead_serves_only_the_unchanged_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("VALUE = 1\n")
    ahead = ScriptAhead(str(script))
    code = ahead(str(script))
    assert code is not None and code.co_filename == str(script)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["VALUE"] == 1
    assert ahead(str(tmp_path / "other.py")) is None
    script.write_text("VALUE = 22\n")  # edited: compiled again at the start
    assert ahead(str(script)) is None


def test_a_script_that_cannot_be_compiled_ahead_is_compiled_at_the_start(tmp_path, monkeypatch):
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert ScriptAhead(str(broken))(str(broken)) is None  # the start says what is wrong
    missing = str(tmp_path / "missing.py")
    assert ScriptAhead(missing)(missing) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel.py").write_text("pass\n")
    assert ScriptAhead("rel.py")(str(tmp_path / "rel.py")) is not None  # made absolute
