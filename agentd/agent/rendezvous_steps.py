"""The template's side of the rendezvous: rank assignment, the round watch, the exit
barrier, and what the membership lease allows (a mixin of :class:`SimpleElasticAgent`).

Everything here talks to the rendezvous handler and nothing else; the template calls it
at the points of its loop that torch's agent has (rendezvous before a start, the exit
barrier after success), and the round watch wakes the loop when the round ends elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentd.exceptions import AgentdError, AgentStopped
from agentd.group import Worker, WorkerGroup, WorkerState
from agentd.rendezvous.api import (
    LOST_REASON,
    FindsLostPeers,
    LeasedMembership,
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RoleInstanceInfo,
    ShowsJob,
)
from agentd.spec import WorkerSpec
from agentd.support.aio import first_done
from agentd.support.sync_bridge import agent_step

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_WATCH_RETRY = 5.0
_LOST = (
    "[%s] The root cause of this node's worker failure: %s (its agent stopped answering); "
    "%d node(s) left, the job needs %d"
)
_LEFT = "[%s] Our workers failed as a member left the round (%s): a membership change"
_NOT_LOST = (
    "[%s] %s did not answer a roll call after our workers failed, and the round went on "
    "for %gs: the failure is this node's own"
)
_DRAINED = (
    "[%s] Our workers failed while node %s drains (its workers leave); waiting up to %gs "
    "for the round to end without it"
)
ROLL_CALL_WAIT = 1.0
"""Seconds the peers have to answer a roll call (a live round watch answers in ms)."""


def assign_worker_ranks(
    role_infos: Sequence[RoleInstanceInfo], group_rank: int, spec: WorkerSpec
) -> list[Worker]:
    """Global and role ranks for this agent's workers, as the seed assigns them.

    Agents are ordered by group rank; an agent's workers take the next ``local_world_size``
    global ranks, and the next role ranks among agents of the same role.
    """
    infos = sorted(role_infos, key=lambda info: info.rank)
    world_size = sum(info.local_world_size for info in infos)
    base_rank = sum(info.local_world_size for info in infos if info.rank < group_rank)
    same_role = [info for info in infos if info.role == spec.role]
    role_world_size = sum(info.local_world_size for info in same_role)
    base_role_rank = sum(info.local_world_size for info in same_role if info.rank < group_rank)
    return [
        Worker(
            local_rank=i,
            global_rank=base_rank + i,
            role_rank=base_role_rank + i,
            world_size=world_size,
            role_world_size=role_world_size,
        )
        for i in range(spec.local_world_size)
    ]


def kept_global_ranks(
    role_infos: Sequence[RoleInstanceInfo], kept: Sequence[Sequence[int]]
) -> frozenset[int]:
    """The global ranks of the workers each agent kept (``kept``: local ranks by group
    rank), numbered as :func:`assign_worker_ranks` numbers them."""
    infos = sorted(role_infos, key=lambda info: info.rank)
    base = itertools.accumulate((i.local_world_size for i in infos), initial=0)
    pairs = zip(base, kept[: len(infos)], strict=False)  # base has one more: the total
    return frozenset(first + r for first, ranks in pairs for r in ranks)


class RendezvousSteps:
    """The rendezvous steps of the agent template (state lives on the agent)."""

    _worker_group: WorkerGroup
    _rdzv_handler: RendezvousHandler | None
    kept_ranks: frozenset[int] | None = None
    _wakeup: asyncio.Event
    _exit_barrier_timeout: float
    _round_watch: asyncio.Task[None] | None
    _round_ended: str | None
    _round_closed: RendezvousClosedError | None
    _stepping_out: str | None
    _stop_requested: asyncio.Event
    lost_peer: dict[str, Any] | None = None
    """The peer whose loss failed this node's workers (its lease ran out): the root cause
    a failure report names (:func:`~agentd.agent.lost_peer.lost_node`); else None."""
    _leaving_alone: bool = False
    """No other node runs the job this node leaves: it ends here (a drain of the last)."""
    generation: int

    if TYPE_CHECKING:  # the template's

        async def _timed_stop(self, group: WorkerGroup) -> None: ...

        def _set_state(self, new: WorkerState, reason: str) -> None: ...

        async def _restart_group(
            self, group: WorkerGroup, reason: str, stopped: bool = False
        ) -> None: ...

        def _raise_if_stop_requested(self) -> None: ...

    @property
    def rdzv_handler(self) -> RendezvousHandler:
        handler = self._rdzv_handler or self._worker_group.spec.rdzv_handler
        assert handler is not None  # set in SimpleElasticAgent.__init__
        return handler

    async def _lost_peer(self, group: WorkerGroup, state: WorkerState) -> str:
        """After our workers failed or hung (``state``) in a round of several nodes: the
        peer whose loss made them fail, when the round goes on without it at MIN nodes or
        more (a membership change: it spends no restart); '' otherwise (a loss below MIN is
        still named in the report, :attr:`lost_peer`). A peer that does not answer a roll
        call is waited for up to its lease; a round whose peers all answer was failed by
        this node, unless a peer drains (its ranks leave: the round's end is waited for) or
        the round ended with a member that left it for good (SIGTERM, a drain, a release):
        those are membership changes too, as a real collective fails once a peer's ranks
        are gone."""
        handler = self.rdzv_handler
        self.lost_peer = None  # an earlier loss is not this failure's cause
        failed = state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        if not failed or (group.group_world_size or 1) < 2:
            return ""
        if not isinstance(handler, FindsLostPeers):
            return ""
        draining = self._peer_drain_under_way()
        if draining:  # its workers leave, so ours may fail first: a membership change
            if self._round_ended is None and self._round_closed is None:
                wait = handler.peer_loss_timeout() + ROLL_CALL_WAIT
                log.info(_DRAINED, group.spec.role, draining, wait)
                await self._wait_for_round_end(wait)
            why = self._round_ended
            if why is not None and await self._enough_without(group, handler.min_nodes()):
                return why
            return ""
        if self._round_ended is None and self._round_closed is None:
            from agentd.store.api import StoreError  # a handler that calls rolls has a store

            try:
                silent = await handler.roll_call(ROLL_CALL_WAIT)
            except StoreError as exc:  # the store's own trouble: the leases decide
                log.debug("Roll call failed: %s", exc)
                return ""
            if not silent:
                return ""
            wait = handler.peer_loss_timeout() + ROLL_CALL_WAIT
            # one account: the line that follows says whether it was lost
            log.debug("[%s] %s silent at the roll call; waiting %gs", group.spec.role, silent, wait)
            await self._wait_for_round_end(wait)
            if self._round_ended is None and self._round_closed is None:
                log.info(_NOT_LOST, group.spec.role, ", ".join(silent), wait)
        why = self._round_ended or ""
        if why and LOST_REASON not in why and await handler.departed() > 0:
            # a peer that left for good (SIGTERM, a drain, a release): a membership change
            if not await self._enough_without(group, handler.min_nodes()):
                return ""
            log.info(_LEFT, group.spec.role, why)
            return why
        if LOST_REASON not in why:
            return ""
        from agentd.agent.lost_peer import lost_node  # on a peer's loss alone

        self.lost_peer = lost_node(why, handler.peer_loss_timeout())
        left, needed = (group.group_world_size or 1) - 1, handler.min_nodes()
        log.warning(_LOST, group.spec.role, why, left, needed)
        return why if await self._enough_without(group, needed) else ""

    async def _lost_below_min(self, group: WorkerGroup) -> bool:
        """Whether the round ended because a member was lost (its lease ran out) and the
        nodes left, with the spares waiting to join, are fewer than MIN: then no new round
        can form without a replacement, and this node's healthy workers have failed with
        the job; the lost node is named the root cause (:attr:`lost_peer`). A store that
        cannot say how many wait leaves it a membership change, as before."""
        why, handler = self._round_ended or "", self.rdzv_handler
        if LOST_REASON not in why or not isinstance(handler, FindsLostPeers):
            return False
        needed = handler.min_nodes()
        if await self._enough_without(group, needed):
            return False
        from agentd.agent.lost_peer import lost_node  # on a peer's loss alone

        self.lost_peer = lost_node(why, handler.peer_loss_timeout())
        log.warning(_LOST, group.spec.role, why, (group.group_world_size or 1) - 1, needed)
        return True

    async def _wait_for_round_end(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the round to end or close elsewhere (or a stop)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while self._round_ended is None and self._round_closed is None:
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    if self._stop_requested.is_set():
                        break

    def _peer_drain_under_way(self) -> str:
        """The node whose drain this agent follows since its workers started ('': none)."""
        return ""

    async def _enough_without(self, group: WorkerGroup, needed: int, gone: int = 1) -> bool:
        """Whether the round's nodes but ``gone``, with the spares waiting to join, reach
        ``needed`` (MIN); a store that cannot say how many wait counts as yes."""
        left = (group.group_world_size or 1) - gone
        if left >= needed:
            return True
        try:
            spares = await self.rdzv_handler.num_nodes_waiting()
        except AgentdError as exc:
            log.debug("Could not count the nodes waiting: %s", exc)
            return True
        return left + spares >= needed

    async def _watch_round(self) -> None:
        """Wake the run loop when the rendezvous round ends elsewhere (no polling)."""
        while True:
            try:
                why = await self.rdzv_handler.round_over()
            except RendezvousClosedError as exc:
                self._round_closed = exc
                self._wakeup.set()
                return
            except AgentdError as exc:  # the store is down: the workers go on meanwhile
                log.warning("Cannot watch the rendezvous (%s); retrying in %gs", exc, _WATCH_RETRY)
                await asyncio.sleep(_WATCH_RETRY)
                continue
            self._round_ended = why
            self._wakeup.set()
            return

    async def _stop_as_round_ends(self, group: WorkerGroup, why: str) -> None:
        """Stop our workers while the peers learn that the round is over."""
        self._stop_round_watch()
        ending = asyncio.create_task(self._end_round(why))
        await self._timed_stop(group)
        await ending

    async def _step_out(self, group: WorkerGroup, why: str) -> None:
        """Leave the job without spending a restart: the peers re-form without us while our
        workers stop; we join again when :meth:`_before_join` lets us."""
        after = "the others go on without it"
        if self._leaving_alone:
            after = "no other node runs it: it ends here, unfinished"
        elif fixed_size(self.rdzv_handler):
            after = "the others wait for it, or for a node in its place"
        log.warning("[%s] This node %s; leaving the job (%s)", group.spec.role, why, after)
        await self._stop_as_round_ends(group, f"node {socket.gethostname()} {why}")
        handler = self.rdzv_handler
        if isinstance(handler, LeasedMembership):  # the round re-forms without waiting on us
            try:
                await handler.workers_stopped()
            except AgentdError as exc:
                log.warning("Could not tell the other nodes our workers stopped: %s", exc)
        self._stepping_out = None
        self._set_state(WorkerState.STOPPED, why)
        await self._restart_group(group, reason="node_check", stopped=True)

    async def _before_join(self) -> None:
        """Wait until this host may join a round (at once, unless a subclass gates it)."""

    def _stop_round_watch(self) -> None:
        if self._round_watch is not None:
            self._round_watch.cancel()
            self._round_watch = None
        self._round_ended = None

    async def _end_round(self, reason: str) -> None:
        """Tell the peers this round is over; a store problem is logged, not fatal (the
        peers' membership leases run out instead)."""
        try:
            await self.rdzv_handler.end_round(reason)
        except AgentdError as exc:
            log.warning("Could not tell the other nodes to restart yet: %s", exc)

    async def _unless_stopped(self, step: Coroutine[Any, Any, _T]) -> _T:
        """``step``'s result, unless a stop is requested first: then ``step`` is cancelled
        and AgentStopped raised (a wait for peers, or for the exit barrier, never outlasts
        SIGTERM or SIGINT; the shutdown that follows gives the membership back)."""
        done, _ = await first_done(step, self._stop_requested.wait())
        if done.cancelled():
            self._raise_if_stop_requested()
        return done.result()

    async def _close_rendezvous(self, succeeded: bool, reason: str) -> None:
        try:
            await self.rdzv_handler.set_closed(succeeded, reason)
        except AgentdError as exc:
            log.warning("Could not close the rendezvous: %s", exc)

    def _stop_timeout(self) -> float:
        """How long stopping may wait before SIGKILL: the spec's stop timeout, but never
        past the end of our membership lease (the others may reuse our ranks then)."""
        timeout = self._worker_group.spec.stop_timeout
        handler = self.rdzv_handler
        deadline = handler.lease_deadline() if isinstance(handler, LeasedMembership) else None
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        return timeout

    def _membership_lost(self) -> str:
        """Why we are no longer a member of our round ('' while we are, or if the
        rendezvous has no notion of it)."""
        handler = self.rdzv_handler
        return handler.membership_lost() if isinstance(handler, LeasedMembership) else ""

    @agent_step
    async def _rendezvous(self, worker_group: WorkerGroup) -> None:
        group = worker_group
        spec = group.spec
        await self._before_join()
        info: RendezvousInfo = await self.rdzv_handler.next_rendezvous()
        role_infos = info.role_infos or (
            RoleInstanceInfo(spec.role, info.group_rank, spec.local_world_size),
        )
        group.store = info.store
        group.group_rank = info.group_rank
        group.group_world_size = info.group_world_size
        group.master_addr = spec.master_addr or info.master_addr
        group.master_port = spec.master_port or info.master_port
        group.workers = assign_worker_ranks(role_infos, info.group_rank, spec)
        self.kept_ranks = kept_global_ranks(role_infos, info.kept) if info.kept else None
        """The global ranks that kept their process into this round (None: not known)."""
        self.generation = info.generation
        log.info(
            "[%s] Rendezvous complete: run_id=%s generation=%d group_rank=%d/%d "
            "master=%s:%s global ranks %s, world size %d",
            spec.role,
            info.run_id,
            info.generation,
            info.group_rank,
            info.group_world_size,
            group.master_addr,
            group.master_port,
            [w.global_rank for w in group.workers],
            group.workers[0].world_size,
        )

    async def _exit_barrier(self) -> None:
        """Wait (up to ``exit_barrier_timeout``) for the other agents' workers to finish, so
        no agent leaves while its peers may still need it. Skipped on failure."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._exit_barrier_timeout):
                await self._unless_stopped(self.rdzv_handler.exit_barrier())
        except TimeoutError:
            log.warning(
                "Exit barrier timed out after %.0fs; leaving anyway", self._exit_barrier_timeout
            )
            return
        except AgentStopped:
            raise
        except AgentdError as exc:  # our workers succeeded: that is the outcome
            log.warning(
                "Exit barrier: could not wait for the other nodes (%s); our workers "
                "succeeded, so the job is done here (exit 0)",
                exc,
            )
            return
        except Exception:  # a bug in a backend's barrier does not fail a job that succeeded
            log.exception("Exit barrier failed; our workers succeeded, so the job is done here")
            return
        log.debug("Exit barrier passed after %.3fs", time.monotonic() - started)


def fixed_size(handler: RendezvousHandler) -> bool:
    """Whether the job runs only at one size (a static job, or ``--nnodes N``): the others
    cannot go on without a node that leaves."""
    if not isinstance(handler, ShowsJob):
        return False
    settings = handler.settings
    return settings.min_nodes == settings.max_nodes > 1
