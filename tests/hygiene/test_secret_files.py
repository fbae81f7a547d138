"""The token files this process publishes reach its guardian, which removes them only if
the agent dies without withdrawing them (``tests/integration/test_stopping.py`` kills a
store's host with SIGKILL); a clean stop leaves a file whose owner still serves."""

from __future__ import annotations

from pathlib import Path

from agentd.hygiene.service import ProcessHygiene
from agentd.store import token_file
from agentd.support.secrets import on_published


def test_a_listener_learns_what_is_published_before_and_after_it_subscribes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    early = token_file.publish(1, "early")
    heard: list[tuple[Path, str | None]] = []
    stop = on_published(lambda path, token: heard.append((path, token)))
    try:
        late = token_file.publish(2, "late")
        token_file.withdraw(2, "not late's")  # another's token: not withdrawn
        token_file.withdraw(2, "late")
        token_file.withdraw(1, "early")
    finally:
        stop()
    ours = [(path, token) for path, token in heard if path.is_relative_to(tmp_path)]
    assert ours == [(early, "early"), (late, "late"), (late, None), (early, None)]


async def test_a_clean_stop_leaves_the_token_of_a_store_that_still_serves(tmp_path, monkeypatch):
    """Several agents may share one process (the Python API): one that stops must not take
    the token of a store that another one's clients still read."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    hygiene = ProcessHygiene("secret-test", "run", enabled=True, fresh_run_id=True)
    await hygiene.start()
    try:
        path = token_file.publish(3, "serving")
        await hygiene.started([])  # the guardian starts, and learns of the file
        assert hygiene._guardian is not None
    finally:
        await hygiene.stop()  # reaps the guardian: it has done all it will do
    assert path.read_text() == "serving"
    token_file.withdraw(3, "serving")
    assert not path.exists()
