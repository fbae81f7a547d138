"""``elastic.utils.store`` over torch's own ``TCPStore``, as a torch user shares one between
ranks (threads here, each rank with its own client)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from tests.conftest import free_port
from tests.torch_api.conftest import elastic

torch_distributed = pytest.importorskip("torch.distributed")


@pytest.fixture
def stores():
    """``stores(n)``: n clients of one TCPStore (the first hosts it), each with a 30 s
    timeout."""
    made = []

    def make(n: int) -> list:
        port = free_port()
        for i in range(n):
            made.append(
                torch_distributed.TCPStore(
                    "127.0.0.1",
                    port,
                    n,
                    i == 0,
                    timeout=timedelta(seconds=30),
                    wait_for_workers=False,
                )
            )
        return made[-n:]

    yield make
    del made[:]


def in_threads(*calls) -> list:
    """Run each call in its own thread; their results (or exceptions), in order."""
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_synchronize_and_barrier_put_the_callers_timeout_back(impl, stores):
    utils = elastic(impl, "utils.store")
    [a, b] = stores(2)
    results = in_threads(
        lambda: utils.synchronize(a, b"zero", 0, 2, "sync/", timeout=5),
        lambda: utils.synchronize(b, b"one", 1, 2, "sync/", timeout=5),
    )
    assert results == [[b"zero", b"one"]] * 2
    in_threads(lambda: utils.barrier(a, 2, "bar", 5), lambda: utils.barrier(b, 2, "bar", 5))
    assert a.timeout == b.timeout == timedelta(seconds=30)


def test_rank_0s_get_all_returns_once_every_rank_has_read(impl, stores):
    """Rank 0 often hosts the store: it must not finish, and take the store with it,
    while another rank still reads."""
    utils = elastic(impl, "utils.store")
    [a, b] = stores(2)
    a.set("data/0", b"zero")
    b.set("data/1", b"one")
    got: list = []
    rank0 = threading.Thread(target=lambda: got.append(utils.get_all(a, 0, "data/", 2)))
    rank0.start()
    rank0.join(1.0)
    assert rank0.is_alive() and not got  # every value is there, but rank 1 has not read
    assert utils.get_all(b, 1, "data/", 2) == [b"zero", b"one"]
    rank0.join(30)
    assert got == [[b"zero", b"one"]]


def test_a_timed_out_barrier_with_ranks_names_the_missing_one(impl, stores):
    utils = elastic(impl, "utils.store")
    [a, b, _] = stores(3)

    def arrive(store, rank):
        return lambda: utils.barrier(
            store,
            3,
            "late",
            barrier_timeout=1,
            rank=rank,
            rank_tracing_decoder=lambda r: f"host{r}",
            trace_timeout=0.2,
        )

    rank0, rank1 = in_threads(arrive(a, 0), arrive(b, 1))
    assert type(rank0).__name__ == type(rank1).__name__ == "DistStoreError"
    assert "missing_ranks=[host2]" in str(rank0)
    assert "host0" in str(rank1)  # the others point to rank 0's list
