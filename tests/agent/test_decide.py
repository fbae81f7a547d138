"""The run loop's decision, rule by rule, on plain facts (no processes, no loop)."""

from __future__ import annotations

import pytest

from agentd.agent.decide import Action, Situation, decide
from agentd.group import WorkerState

H, S, F, U = WorkerState.HEALTHY, WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.UNHEALTHY


@pytest.mark.parametrize(
    ("situation", "action"),
    [
        (Situation(H), Action.WATCH),
        (Situation(S), Action.SUCCEED),
        # A peer closed the rendezvous as failed: only a healthy group hears of it here.
        (Situation(H, peer_failed=True), Action.FAIL_PEER),
        (Situation(H, peer_failed=True, membership_lost=True), Action.FAIL_PEER),
        (Situation(S, peer_failed=True), Action.SUCCEED),
        (Situation(F, peer_failed=True, remaining_restarts=1), Action.RESTART),
        # The round is over for us: re-form, no restart spent, whatever our workers did...
        (Situation(H, membership_lost=True), Action.REJOIN),
        (Situation(H, round_ended=True), Action.REJOIN),
        (Situation(F, membership_lost=True), Action.REJOIN),
        (Situation(U, membership_lost=True, remaining_restarts=0), Action.REJOIN),
        # ...unless they succeeded: the exit barrier copes with a lost store.
        (Situation(S, membership_lost=True), Action.SUCCEED),
        (Situation(S, round_ended=True), Action.SUCCEED),
        # A member lost below MIN ended the round: no membership change, our group fails.
        (Situation(H, round_ended=True, lost_below_min=True, remaining_restarts=1), Action.RESTART),
        (Situation(H, round_ended=True, lost_below_min=True), Action.GIVE_UP),
        (Situation(F, round_ended=True, lost_below_min=True), Action.GIVE_UP),
        (Situation(S, round_ended=True, lost_below_min=True), Action.SUCCEED),
        # A failure elsewhere ended the round, but ours failed too: that spends a restart.
        (Situation(F, round_ended=True, remaining_restarts=1), Action.RESTART),
        # Failures: restart while restarts remain and the exit code is retryable.
        (Situation(F, remaining_restarts=2), Action.RESTART),
        (Situation(U, remaining_restarts=1), Action.RESTART),
        (Situation(F, remaining_restarts=0), Action.GIVE_UP),
        (Situation(U, remaining_restarts=0), Action.GIVE_UP),
        (Situation(F, remaining_restarts=3, retryable=False), Action.GIVE_UP),
        # This host failed its node checks: it leaves, no restart spent, unless done.
        (Situation(H, stepping_out=True), Action.STEP_OUT),
        (Situation(F, stepping_out=True, remaining_restarts=1), Action.STEP_OUT),
        (Situation(H, stepping_out=True, membership_lost=True), Action.STEP_OUT),
        (Situation(H, stepping_out=True, peer_failed=True), Action.FAIL_PEER),
        (Situation(S, stepping_out=True), Action.SUCCEED),
        # A monitor that cannot tell (UNKNOWN) ends the run, no restart spent, as torch's.
        (Situation(WorkerState.UNKNOWN, remaining_restarts=1), Action.ABORT),
        (Situation(WorkerState.UNKNOWN, membership_lost=True), Action.REJOIN),
    ],
)
def test_decide(situation, action):
    assert decide(situation) is action


def test_every_action_is_reachable():
    states = [H, S, F, U, WorkerState.UNKNOWN]
    seen = {
        decide(Situation(state, peer, lost, ended, restarts, retryable, out))
        for state in states
        for out in (False, True)
        for peer in (False, True)
        for lost in (False, True)
        for ended in (False, True)
        for restarts in (0, 1)
        for retryable in (False, True)
    }
    assert seen == set(Action)
