"""Which ranks hold the job's state: agreed by the ranks themselves, once per attempt.

The agent's plan (:mod:`agentd.inprocess.wire`) names the rank that hands its state over:
the lowest rank every node said it kept when it joined the round. A kept process can be
lost after its node said so and before the round starts (killed while the round waits for
a late node); its agent then starts a new process in its place, and the plan would have
that process, with its step 0 and its initial weights, hand them to every rank. So before
a hand-over every rank tells the others, in one all-reduce of one small integer per rank,
whether it holds the job's state: a process holds it once a :func:`~agentd.inprocess.sync`
of an attempt returned in it (the first attempt's says to load the checkpoint), or a
:func:`~agentd.inprocess.sync_object` that had nothing to receive; a new process holds
nothing until then, nor does a receiver while it receives. A holder says which round's
state it holds (the rendezvous round of the attempt whose sync it held it in): a node
that waited as a spare while the others trained a round keeps its processes, with the
state of the round before. Only the holders of the latest round count: the source is the
lowest rank among them, and every other rank receives the state; where no rank holds it,
the attempt is fresh (load the checkpoint). A process its agent calls stale
(:data:`~agentd.inprocess.wire.STALE_ENV`: its node missed a round) holds nothing until
it syncs again, so its older state never stands for the job's, even where every newer
holder is gone (nor in a round that re-forms before its sync).

Before the rounds were compared (``bench/bench_chaos.py --inprocess --stragglers`` seed
9, 2026-12-04), every rank of a round whose ranks all kept their processes held the
state, the spare's stale ones too, and nothing was handed over: the replicas' weights
differed from then on, and the step the job went on from was the spare's, 15 behind.
With ``--place tls`` as well (seed 23), every rank of the latest round was lost before
the spare came back: its round-1 state was the newest held, and the job went on from step
183, 21 behind the furthest and 17 behind its checkpoint, where it now loads the latter.
"""

from __future__ import annotations

import dataclasses
import logging

from agentd.inprocess import worker
from agentd.inprocess.worker import Restart

log = logging.getLogger(__name__)

_held: int | None = None
"""The round whose state this process holds (None: none; see the module docstring)."""
_agreed: Restart | None = None
"""The attempt whose :class:`Restart` the ranks agreed on (current() is then it)."""


def hold(holds: bool) -> None:
    """This process holds the job's state of the current attempt's round from now on
    (True), or does not (False: it is receiving it, and an interruption would leave it
    half-written)."""
    global _held
    _held = worker.current().round if holds else None
    if holds:
        worker.synced()


def agreed() -> Restart:
    """This attempt's :class:`Restart` as every rank agrees on it: ``source`` the lowest
    rank that holds the job's state (None: nothing to hand over, every rank holds it), and
    ``replaced`` those that do not; ``fresh`` where none does. On a fresh attempt nothing
    is communicated; otherwise every rank must call this at the same point (the first
    :func:`~agentd.inprocess.sync` or :func:`~agentd.inprocess.sync_object` of the
    attempt does), after ``init_process_group``."""
    global _agreed
    restart = worker.current()
    if restart.fresh or restart is _agreed:
        return restart
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if worker.stale():
        hold(False)  # its node missed a round: an older state than the job's
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    holding = torch.zeros(world, dtype=torch.int64, device=device)
    holding[rank] = 0 if _held is None else _held + 1  # 0: none
    dist.all_reduce(holding)
    rounds = holding.tolist()
    latest = max(rounds)
    holders = [r for r, held in enumerate(rounds) if held and held == latest]
    stale = [r for r, held in enumerate(rounds) if held and held != latest]
    others = tuple(sorted(set(range(world)) - set(holders)))
    if stale and rank == holders[0]:  # said once, by the source
        log.warning(
            "agentd.inprocess: rank(s) %s hold the state of an earlier round than round %d's "
            "(their node missed a round): they receive rank %d's",
            stale,
            latest - 1,
            rank,
        )
    if not holders:
        if rank == 0:  # said once for the job
            log.warning(
                "agentd.inprocess: no rank holds the job's state (the ranks kept were lost "
                "before this attempt started, or missed a round): every rank starts from the "
                "checkpoint"
            )
        restart = dataclasses.replace(restart, replaced=(), source=None, fresh=True)
    elif others or restart.source is not None:
        if restart.source == rank and rank not in holders:  # said by that rank alone
            log.warning(
                "agentd.inprocess: rank %d was to hand its state over but holds none (a "
                "new process in place of a kept one); rank %d does",
                restart.source,
                holders[0],
            )
        restart = dataclasses.replace(restart, replaced=others, source=holders[0])
    _agreed = restart
    worker.agree(restart)
    return restart
