"""What the agent does after each look at its worker group: a pure decision.

The run loop (:meth:`agentd.agent.template.SimpleElasticAgent._invoke_run`) gathers the
facts into a :class:`Situation` and acts on the :class:`Action` that :func:`decide`
returns; everything that waits or talks to the network stays in the loop. The order of the
rules is the contract:

1. A peer closed the rendezvous as failed while our group is healthy: the job is over
   (FAIL_PEER): stop the workers, FAILED, and raise the peer's error.
2. This host must leave the job (its node checks failed) while its workers have not all
   succeeded: end the round for every peer, stop, and rejoin once the checks pass, without
   spending a restart (STEP_OUT).
3. The round is over for us (our membership lease lapsed, or the round ended elsewhere: a
   failure or a join on another node): re-form without spending a restart (REJOIN). Workers
   that succeeded are not asked about their lease: their exit barrier copes with a store
   out of reach.
   A round ended by the loss of a member that leaves fewer than MIN nodes is no
   membership change, though: the job cannot go on as it was, and our healthy group has
   failed with it (the lost node is the root cause): RESTART while restarts remain
   (the next round waits for a replacement), else GIVE_UP, as if our workers had failed
   of it first, which they often do.
4. Healthy: keep watching (WATCH). Succeeded: the exit barrier, then done (SUCCEED).
   Unknown (the monitor could not tell): stop and raise without spending a restart (ABORT),
   as torch's agent does.
5. Failed or unhealthy: restart while restarts remain and the root cause's exit code is
   retryable (RESTART); otherwise the group has failed for good (GIVE_UP). Before it
   restarts, the loop asks the store whether a round could form again: members whose
   workers succeeded run no more, and when the rest fall short of MIN it gives up instead
   (:meth:`~agentd.agent.restart_steps.RestartSteps._no_round_to_restart_in`).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from agentd.group import WorkerState


class Action(enum.Enum):
    """What the run loop does next."""

    WATCH = "watch"
    FAIL_PEER = "fail_peer"
    REJOIN = "rejoin"
    STEP_OUT = "step_out"
    SUCCEED = "succeed"
    ABORT = "abort"
    RESTART = "restart"
    GIVE_UP = "give_up"


class Situation(NamedTuple):
    """The facts one decision needs."""

    state: WorkerState
    """What the last look at the workers found (never INIT or STOPPED here)."""
    peer_failed: bool = False
    """The rendezvous was closed as failed by a peer."""
    membership_lost: bool = False
    """Our lease on the round lapsed."""
    round_ended: bool = False
    """The round ended elsewhere (a new generation, a member gone)."""
    stepping_out: bool = False
    """This host must leave the job: its node checks failed."""
    remaining_restarts: int = 0
    retryable: bool = True
    """The root cause's exit code is not listed as non-retryable."""
    lost_below_min: bool = False
    """The round ended because a member was lost, leaving fewer than MIN nodes."""


def decide(situation: Situation) -> Action:
    """The next action for ``situation`` (see the module docstring for the rules)."""
    state = situation.state
    if situation.peer_failed and state is WorkerState.HEALTHY:
        return Action.FAIL_PEER
    if state is not WorkerState.SUCCEEDED and situation.stepping_out:
        return Action.STEP_OUT
    if state is not WorkerState.SUCCEEDED and situation.membership_lost:
        return Action.REJOIN
    if state is WorkerState.HEALTHY and situation.lost_below_min:
        return Action.RESTART if situation.remaining_restarts > 0 else Action.GIVE_UP
    if state is WorkerState.HEALTHY:
        return Action.REJOIN if situation.round_ended else Action.WATCH
    if state is WorkerState.SUCCEEDED:
        return Action.SUCCEED
    if state is WorkerState.UNKNOWN:
        return Action.ABORT
    if situation.remaining_restarts > 0 and situation.retryable:
        return Action.RESTART
    return Action.GIVE_UP
