"""The store's own token: a private per-user directory, a 0600 file, read by same-user
clients; anything suspicious in the directory's place is refused."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from agentd.exceptions import StartError
from agentd.store import token_file
from agentd.store.api import StoreAuthError
from agentd.store.http_client import HttpStore
from agentd.store.server import StoreServer


@pytest.fixture
def private_runtime_dir(private_runtime_dir):
    return private_runtime_dir / "agentd"


def test_published_tokens_are_private_and_withdrawn_only_by_their_owner(private_runtime_dir):
    path = token_file.publish(29400, "first")
    assert stat.S_IMODE(os.stat(private_runtime_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert token_file.read(29400) == "first"
    token_file.publish(29400, "second")  # a newer store on the same port
    token_file.withdraw(29400, "first")  # the old one leaves: the new token stays
    assert token_file.read(29400) == "second"
    token_file.withdraw(29400, "second")
    assert token_file.read(29400) is None


def test_an_open_run_dir_of_ours_is_closed(private_runtime_dir):
    private_runtime_dir.mkdir(mode=0o755)
    os.chmod(private_runtime_dir, 0o755)
    token_file.publish(1, "t")
    assert stat.S_IMODE(os.stat(private_runtime_dir).st_mode) == 0o700
    token_file.withdraw(1, "t")  # this process's listeners (a later test's) hear of it no more


def test_a_symlink_in_place_of_the_run_dir_is_refused(private_runtime_dir, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    private_runtime_dir.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StartError, match="is not a directory owned by uid"):
        token_file.publish(1, "t")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_run_dir_owned_by_someone_else_is_refused(private_runtime_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    private_runtime_dir.mkdir(mode=0o700)
    os.chown(private_runtime_dir, 65534, 65534)
    with pytest.raises(StartError, match="refusing to keep a secret there"):
        token_file.publish(1, "t")


async def test_a_client_waits_for_a_token_published_late_and_follows_a_new_one():
    server = StoreServer()
    await server.start()
    port = server.port
    token = server.token
    token_file.withdraw(port, token)  # as if the server had not published it yet
    client = HttpStore(f"127.0.0.1:{port}", retry_timeout=10)
    try:
        asyncio.get_running_loop().call_later(0.3, token_file.publish, port, token)
        await client.set("k", b"v")
        await server.stop()  # a new store on the same port: a new token
        server = StoreServer(port=port)
        await server.start()
        await client.set("k", b"again")
        assert await server.store.get("k") == b"again"
    finally:
        await client.close()
        await server.stop()


async def test_without_a_token_a_client_gives_up_with_a_clear_error():
    server = StoreServer()
    await server.start()
    token_file.withdraw(server.port, server.token)
    client = HttpStore(f"127.0.0.1:{server.port}", retry_timeout=0.3)
    try:
        with pytest.raises(StoreAuthError, match=r"no token was given and .* does not exist"):
            await client.get("k")
    finally:
        await client.close()
        await server.stop()


def test_a_members_copy_of_the_jobs_token_is_read_when_its_seed_published_none(
    private_runtime_dir,
):
    assert token_file.read(29401) is None
    older = token_file.keep_copy(29401, "stale")
    os.utime(older, (1, 1))  # a copy left by an agent killed with its guardian, long ago
    copy = token_file.keep_copy(29401, "job")
    token_file.keep_copy(294010, "another port's")
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert token_file.read(29401) == "job"  # the newest copy
    token_file.publish(29401, "seed")
    assert token_file.read(29401) == "seed"  # the seed's own file comes first
    token_file.withdraw(29401, "seed")
    token_file.drop_copy(copy, "another token")  # not ours any more: kept
    assert token_file.read(29401) == "job"
    token_file.drop_copy(copy, "job")
    assert token_file.read(29401) == "stale"
    assert token_file.read(29401, "health") is None  # only a store's token is copied
    assert not (private_runtime_dir / "health-29401.token").exists()


async def test_a_store_started_where_a_job_keeps_its_token_takes_that_token(
    private_runtime_dir,
):
    """A seed restarted at its endpoint serves with the job's token, which the job's
    candidates tell their term with, and publishes it as its own."""
    first = StoreServer()
    await first.start()
    port, token = first.port, first.token
    copy = token_file.keep_copy(port, token)  # a member standing by for this seed
    await first.stop()  # killed, its file withdrawn by its guardian
    assert not token_file.token_path(port).exists()
    second = StoreServer(port=port)
    try:
        await second.start()
        assert second.token == token
        assert token_file.token_path(port).read_text() == token
        client = HttpStore(f"127.0.0.1:{port}", retry_timeout=5)
        try:
            await client.set("k", b"v")
        finally:
            await client.close()
    finally:
        await second.stop()
        token_file.drop_copy(copy, token)
    assert StoreServer(port=port).token != token  # nobody keeps it now: a new one


async def test_a_members_guardian_reaches_the_candidate_serving_after_a_failover():
    """On loopback with no token given, a member's client sends the token its seed
    published for the seed's port. The client its guardian makes from the spec goes first
    to the candidate that serves now, on another port, for which nothing is published:
    the spec carries the token itself. Before, it carried none, and a killed member's
    guardian was refused by every candidate (401) once the job had failed over, so its
    release was lost and the round waited for the forgotten round's fence
    (``bench/bench_seed_back.py --both-lost``: 20 s)."""
    from agentd.store.client_spec import client_from_spec
    from agentd.store.connect import http_store_opener
    from tests.conftest import free_port

    port = free_port()
    seed = await http_store_opener("127.0.0.1", port, None, True)()
    member = await http_store_opener("127.0.0.1", port, None, False, standby=True)()
    guardian = None
    try:
        assert seed.prepare is None and member.prepare is not None
        await member.store.set("hello", b"1")
        candidate = await member.prepare()  # on another port: the seed's is taken here
        assert candidate and candidate != f"127.0.0.1:{port}"
        for _ in range(100):  # its offer is answered in the background
            if candidate in member.store.endpoints:
                break
            await asyncio.sleep(0.05)
        await seed.close()  # the store's host is lost; the member's candidate takes over
        await member.store.set("moved", b"1")
        assert member.serving is not None and member.serving()
        assert member.client_spec is not None
        spec = member.client_spec()
        assert spec["endpoints"][spec["serving"]] == candidate
        guardian = client_from_spec(spec, 5.0)
        assert await guardian.get("moved") == b"1"
    finally:
        if guardian is not None:
            await guardian.close()
        await member.close()
        await seed.close()
