"""A store server restarted empty says so: how long ago its previous self last held leases.

``agentd store`` keeps its keys in memory. Killed and started again on its port (systemd's
``Restart=``, a container restarted in its pod), it knows no lease and no round, while the
agents of the job it served may still run workers on the leases it granted. An agent of
that job that reaches the new store learns from its own memory that the store forgot the
run, and fences the round it knew (:mod:`agentd.rendezvous.forgotten`); but new nodes that
reach it first know nothing to fence, and sealed a round there at once beside the old
workers (seeds 3096 and 7280 of ``bench/simulate.py``: a rank held twice).

So the server writes, as its first TTL key is written and then every :data:`EVERY` while
it holds any, a small record beside its token (:func:`~agentd.store.token_file.run_dir`):
this boot's id, the monotonic time and the longest TTL it granted since it last held none
(:class:`AliveRecord`). Started again on the port and finding a record of this boot, it
tells its clients how long ago its previous self was last seen holding leases, under
:data:`KEY` (outside every run's ``agentd/<run id>/`` prefix), rewritten every
:data:`EVERY` with the time grown (:func:`tell`), until no lease it knew of can have
outlived it, whatever the layers above add (:data:`BEYOND`). A rendezvous whose first
round in this store finds the word holds that round's seal until its own leases would
have ended (``agentd.rendezvous.forgotten.hold``), adding :data:`EVERY` for the record's
age at the crash; a word read up to :data:`EVERY` after it was written says too little,
so the reader waits longer, never less. The record goes when the store holds no TTL key
(the job ended): a store started again then says nothing, and holds nobody.

A restart that loses the record (another boot, another machine, the file removed) is
not covered: such a store is as new. Etcd keeps its keys on disk and needs none of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentd.support.boot import boot_id

if TYPE_CHECKING:
    from agentd.store.memory import MemoryStore

log = logging.getLogger(__name__)

KEY = "agentd-store/forgot"
"""JSON ``{"ago": seconds}``: how long ago the store's previous self last held leases."""
EVERY = 1.0
"""How often the record is written while TTL keys live, and the word rewritten."""
BEYOND = 10.0
"""How long past the longest TTL the word is kept: the guardian's slack, the fence and a
cut-off store's grace the rendezvous adds (4.5 s) fit well within it."""
FILE_NAME = "store-{port}.alive"


class Forgot(NamedTuple):
    """What a restarted store learned from its record: how long ago its previous self last
    held leases, and the longest TTL it had granted."""

    ago: float
    ttl: float

    @property
    def told_until(self) -> float:
        """How long after the last sign of leases the word is worth telling."""
        return EVERY + self.ttl + BEYOND

    @property
    def worth_telling(self) -> bool:
        return self.ago < self.told_until


def word(ago: float) -> bytes:
    """The value of :data:`KEY` that says ``ago`` seconds."""
    return json.dumps({"ago": round(ago, 3)}).encode()


def read_word(raw: bytes | None) -> float | None:
    """The seconds a :data:`KEY` value says (None: absent or not a word of ours)."""
    if raw is None:
        return None
    try:
        ago = json.loads(raw)["ago"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(ago, bool) or not isinstance(ago, int | float) or not 0 <= ago < 1e9:
        return None
    return float(ago)


async def tell(
    store: MemoryStore, forgot: Forgot, clock: Callable[[], float] = time.monotonic
) -> None:
    """Keep :data:`KEY` in ``store`` saying how long ago its previous self last held
    leases (``forgot.ago`` when this began), until no lease can be left; then delete it."""
    began = clock()
    while True:
        ago = forgot.ago + clock() - began
        if ago >= forgot.told_until:
            break
        await store.set(KEY, word(ago))
        await asyncio.sleep(EVERY)
    await store.delete(KEY)


class AliveRecord:
    """The server's record of its leases on disk (see the module docstring)."""

    def __init__(self, path: Path, boot: str | None = None) -> None:
        self.path = path
        self._boot = boot if boot is not None else boot_id()
        self._kept = False
        self._failing = False

    @classmethod
    def for_port(cls, port: int) -> AliveRecord:
        from agentd.store.token_file import run_dir

        return cls(run_dir() / FILE_NAME.format(port=port))

    def load(self) -> Forgot | None:
        """What the previous self's record says (None: no record, another boot's, or not
        readable)."""
        try:
            doc = json.loads(self.path.read_text())
            alive, ttl, boot = float(doc["alive"]), float(doc["ttl"]), doc["boot"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if self._boot is None or boot != self._boot:
            return None
        return Forgot(max(0.0, time.monotonic() - alive), max(0.0, ttl))

    def note(self, store: MemoryStore) -> None:
        """Write the record if ``store`` holds TTL keys, else remove it."""
        if self._boot is None:
            return
        if not store.holds_ttl_keys:
            if self._kept:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                self._kept = False
            return
        doc = {"boot": self._boot, "alive": time.monotonic(), "ttl": store.longest_ttl}
        staged = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        staged.write_text(json.dumps(doc))
        os.replace(staged, self.path)
        self._kept = True

    async def keep(self, store: MemoryStore) -> None:
        """Note ``store`` as its first TTL key is written (before the write answers), and
        every :data:`EVERY` until cancelled. A write that fails is said once, and tried
        again."""
        store.on_first_ttl_key = lambda: self._note_or_say(store)
        try:
            while True:
                self._note_or_say(store)
                await asyncio.sleep(EVERY)
        finally:
            store.on_first_ttl_key = None

    def _note_or_say(self, store: MemoryStore) -> None:
        try:
            self.note(store)
        except OSError as exc:
            if not self._failing:
                log.warning(
                    "Store: cannot keep its lease record %s (%s); started again after a "
                    "crash, it could not tell new nodes that leases may live on",
                    self.path,
                    exc.strerror or exc,
                )
            self._failing = True
        else:
            self._failing = False
