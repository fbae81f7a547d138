"""S1 across the store host's own restart: the last round its agent saw, kept on disk.

The embedded store lives in the agent that hosts it. When that agent is killed and comes
back at the endpoint (systemd's ``Restart=``, a container restarted in its pod), its store
is empty and the new agent knows nothing, while the others' workers may still run on
leases the old store granted. A new node arriving in those moments sealed a round there
at once beside them (seed 162 of ``bench/simulate.py --failover --kinds ...,restart``:
rank 0 started a second time 33 ms after the restart).

So the hosting agent keeps its last sealed round (:class:`~agentd.rendezvous.accounting.
Carried`) in a small record, rewritten with each lease renewal, with the time until which
a lease its store granted may still run, its guardian's kill and the fence included. An
agent that starts as the store's host and finds that record live (this boot, before that
time) writes the round's fence in its new store (``ctl/forgotten``) and moves the
generation past it, as the first member to reach a store that forgot the run does: the
first round sealed there waits until the round's members are back or gone, or the fence
has ended (:mod:`agentd.rendezvous.forgotten`). A record whose leases have ended still
holds that first round for :data:`TOLD_WITHIN`: the job may live on at a candidate that
tells this one its term within that time, and a round sealed here first would run beside
it (seeds 12697 and 14746: the host back 28 s and 27 s after its kill).

The record keeps the candidate list the store served too. The restarted host asks it at
once (:meth:`~agentd.store.candidacy.Candidacy.recall`): a candidate serving the job under a
newer term makes its fresh store stand by, and its agent follows the list to the job,
without waiting to be told (seed 14063: the job's candidate told the restarted host
nothing in the 0.2 s it was back, and a new node that reached it then learned its fresh
list alone).

A run closed for good, or a host that saw every other agent leave, deletes the record: no
lease of its store is left to fence, and no job lives on elsewhere. So does a restarted
host whose record names a round of one, its own agent, where no other candidate ever stood
by (a one-node job killed and started again): no other node ran workers on its leases or
can serve the job, and its own old workers are gone (they die with their agent, its
guardian ends what else it started, and this start's hygiene kills what a dead agent of
the run left), so its first round waits for nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentd.rendezvous import forgotten
from agentd.rendezvous.accounting import FENCE, Carried
from agentd.rendezvous.forgotten import GUARDIAN_SLACK
from agentd.store.contact import CUT_OFF
from agentd.support.boot import boot_id

if TYPE_CHECKING:
    from agentd.rendezvous.keys import RunKeys
    from agentd.rendezvous.rounds import Rounds
    from agentd.store.api import Store

log = logging.getLogger(__name__)

FILE_NAME = "store_round_{port}.json"
TOLD_WITHIN = 3.0
"""How long a restarted host whose record's leases have ended fences its first round: a
candidate serving the job elsewhere tells an unheard one its term every 2 s
(``agentd.store.candidacy.LOOK_EVERY``), and the answer comes well within a second."""


class RoundKeeper(Protocol):
    """Where a record outlives the agent: a file (:class:`FileKeeper`), or the
    simulation's host. ``boot``: what a record's ``boot`` must be for its monotonic times
    to be this machine's."""

    boot: str

    def load(self) -> dict[str, Any] | None: ...

    def save(self, doc: dict[str, Any]) -> None: ...

    def clear(self) -> None: ...


class Seed(Protocol):
    """The candidacy of the store this agent serves at the endpoint."""

    @property
    def endpoints(self) -> tuple[str, ...]: ...

    async def recall(self, endpoints: Sequence[str]) -> bool: ...


class HostMemory:
    """The store host's record of run ``run_id``'s last round (see the module's
    docstring); ``interval``: the heartbeat interval; ``seed``: the candidacy of the store
    we serve (None: a store of one place, with no list to keep)."""

    def __init__(
        self, keeper: RoundKeeper, run_id: str, interval: float, seed: Seed | None = None
    ) -> None:
        self._keeper = keeper
        self._run_id = run_id
        self._interval = interval
        self._seed = seed
        self._rounds: Rounds | None = None

    async def restore(
        self, rounds: Rounds, store: Store, keys: RunKeys, ttl: float, now: float
    ) -> Carried | None:
        """Fence, in the new ``store`` we serve, the round our record names, ask the list
        it names for the job, and keep ``rounds``' rounds from now on. The round is not
        carried into ``rounds``: counted against in another store (the job's, once ours
        steps down), it would be stale."""
        self._rounds = rounds
        doc = self._keeper.load()
        kept = _decode(doc) if doc is not None else None
        if doc is None or kept is None:
            if doc is not None:
                self._keeper.clear()
            return None
        carried, until = kept
        candidates = _endpoints(doc.get("candidates"))
        if doc.get("member") is True and carried.size == 1 and len(candidates) <= 1:
            said = (
                "Rendezvous %s: this host served the store of round %d before it restarted; "
                "this host's agent was its only member and no other candidate stood by: "
                "nothing runs on its leases (its workers were ended with it)"
            )
            log.info(said, self._run_id, carried.generation)
            self._keeper.clear()
            return None
        leased = doc.get("boot") == self._keeper.boot and until > now
        lives = forgotten.lifetime(ttl) if leased else TOLD_WITHIN
        await forgotten.remember(store, keys, carried, ttl, lives)
        rounds.floor = max(rounds.floor, carried.generation + 1)
        if leased:
            said = (
                "Rendezvous %s: this host served the store until it restarted; round %d (%d "
                "node(s)) may still run workers on its leases: the first round here waits "
                "until they are back or gone, %.1fs at most"
            )
        else:
            said = (
                "Rendezvous %s: this host served the store of round %d (%d node(s)) before "
                "it restarted; the first round here waits %.1fs for a candidate that serves "
                "that job elsewhere to tell it"
            )
        log.info(said, self._run_id, carried.generation, carried.size, lives)
        if self._seed is not None and len(candidates) > 1:
            await self._seed.recall(candidates)
        return carried

    def renewed(self, deadline: float | None) -> None:
        """Our lease runs to ``deadline`` (monotonic): no lease our store granted outlives
        it by more than one heartbeat interval."""
        if deadline is not None:
            self._save(deadline + self._interval + GUARDIAN_SLACK + FENCE + CUT_OFF)

    def handed_over(self, now: float) -> None:
        """Our store was handed over as we leave (the job goes on at the next candidate):
        the leases it granted are renewed there, and that candidate tells this endpoint
        its term every 2 s, so a restart here holds its first round only
        :data:`TOLD_WITHIN`. The others leaving too at that moment (a job stopped whole:
        their leave may race ours) then cost a start of the job again that much at most."""
        self._save(now)
        self._rounds = None  # kept as it is now

    def _save(self, until: float) -> None:
        carried = self._rounds.carried if self._rounds is not None else None
        if carried is None:
            return
        doc = {
            "generation": carried.generation,
            "size": carried.size,
            "member": carried.member,
            "instance": carried.instance,
            "until": until,
            "boot": self._keeper.boot,
            "candidates": list(self._seed.endpoints) if self._seed is not None else [],
        }
        self._keeper.save(doc)

    def forget(self) -> None:
        """No lease of our store is left to fence: the run closed, or everyone left."""
        self._rounds = None
        self._keeper.clear()


def _decode(doc: dict[str, Any]) -> tuple[Carried, float] | None:
    try:
        instance = doc.get("instance")
        carried = Carried(
            int(doc["generation"]),
            int(doc["size"]),
            False,  # our old self's workers count gone through its guardian, never back
            instance if isinstance(instance, str) else None,
        )
        return carried, float(doc["until"])
    except (KeyError, TypeError, ValueError):
        return None


def _endpoints(value: Any) -> list[str]:
    """A record's candidate list: endpoints, or none where it is not a list of them."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return []
    return value


class FileKeeper:
    """The record in one JSON file, written whole or not at all. A file that cannot be
    written is said once and the record is not kept."""

    def __init__(self, path: Path, private: Path | None = None) -> None:
        self.path = path
        self._private = private
        """A shared folder's own folder of ours: written only if it is ours alone."""
        self.boot = boot_id() or ""
        self._failed = False

    def load(self) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def save(self, doc: dict[str, Any]) -> None:
        if self._failed:
            return
        temporary = self.path.with_suffix(".tmp")
        try:
            if self._private is not None:
                self._private.mkdir(mode=0o700, exist_ok=True)
                _check_ours(self._private)
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temporary.write_text(json.dumps(doc))
            os.replace(temporary, self.path)
        except OSError as exc:
            self._failed = True
            log.warning(
                "Rendezvous: cannot keep the store's last round in %s (%s): a restart of "
                "this host at once is not fenced",
                self.path,
                exc.strerror or exc,
            )

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the run's folder, if the record was all of it
            self.path.parent.rmdir()


def _check_ours(folder: Path) -> None:
    """Raise unless ``folder`` is a real folder that only this user may write to (one in
    a shared temporary directory could be anyone's)."""
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(errno.EPERM, "not a folder of this user's alone", str(folder))


def file_keeper(log_dir: str | None, run_id: str, port: int) -> FileKeeper | None:
    """Where the host of the store on ``port`` keeps run ``run_id``'s last round: in the
    run's folder under ``log_dir`` (a volume can outlive a container), else in a folder
    of this user's in the temporary directory. None: ``run_id`` is no folder's name (the
    agent refuses such an id; torch's API passes its own through)."""
    from agentd.support.tempdirs import temp_root

    if not run_id or run_id.startswith(".") or os.sep in run_id or "\0" in run_id:
        return None
    name = FILE_NAME.format(port=port)
    if log_dir:
        return FileKeeper(Path(log_dir) / run_id / name)
    private = Path(temp_root()) / f"agentd-{os.getuid()}"
    return FileKeeper(private / run_id / name, private)
