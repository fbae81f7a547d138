"""The failure report people read: the root cause in full (or the lost node that caused
it), the other failures in one line each."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.group import RunResult, WorkerFailure


def format_failure_report(
    result: RunResult,
    run_id: str,
    entrypoint: str,
    lost_peer: dict[str, Any] | None = None,
    logs: str | None = None,
) -> str:
    """The human-readable failure report: the root cause in full, other failures in one
    line. A lost peer (``lost_peer``) is the root cause, this node's first failure what
    followed. ``logs``: the run's folder, where its workers' output was kept in files (the
    report then says how to read every rank's, merged)."""
    root = result.root_cause
    bar = "=" * 72
    title = f"{entrypoint} FAILED" + (f" (run {run_id})" if run_id else "")
    if root is None and lost_peer is not None:  # the loss was seen before any rank failed
        return "\n".join(
            [
                bar,
                title,
                bar,
                *_lost_peer_lines(lost_peer, "  the job cannot go on without it:"),
                "What followed on this node:",
                "  its workers were stopped, before any of them failed",
                *_logs_line(logs),
                bar,
            ]
        )
    if root is None:
        return f"{entrypoint} failed (run {run_id}) with no recorded worker failure"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.timestamp))
    lines = [
        bar,
        title,
        bar,
        *_lost_peer_lines(lost_peer, "  its loss failed the collectives of this node's ranks:"),
        "What followed on this node (first failure):"
        if lost_peer
        else "Root cause (first failure):",
        f"  time      : {when}.{int(root.timestamp * 1000) % 1000:03d}",
        f"  host      : {root.host}",
        f"  node rank : {root.node_rank}",
        f"  rank      : {root.global_rank} (local rank {root.local_rank}, role {root.role})",
        f"  pid       : {root.pid}",
        f"  exit code : {_describe_exit(root)}",
    ]
    if root.error_file:
        lines.append(f"  error file: {root.error_file}")
    if root.message:
        lines += ["  message   : " + root.message]
    if root.traceback:
        lines += ["  traceback :", *("    " + ln for ln in root.traceback.rstrip().splitlines())]
    elif root.stderr_tail:
        lines += ["  stderr (last lines):"]
        lines += ["    " + ln for ln in root.stderr_tail.rstrip().splitlines()]
    elif not root.message:
        lines.append("  (no error file and nothing on stderr; decorate main with @record)")
    others = [f for f in result.failures.values() if f is not root]
    if others:
        lines.append("Other failures:")
        for failure in sorted(others, key=lambda f: f.timestamp):
            lines.append(
                f"  rank {failure.global_rank} (local {failure.local_rank}, pid {failure.pid}): "
                f"{_describe_exit(failure)}" + (f": {failure.message}" if failure.message else "")
            )
    lines += [*_logs_line(logs), bar]
    return "\n".join(lines)


def _logs_line(logs: str | None) -> list[str]:
    return [f"Every rank's output, merged: agentd logs --dir {logs}"] if logs else []


def _lost_peer_lines(lost: dict[str, Any] | None, then: str) -> list[str]:
    if lost is None:
        return []
    lapsed = lost["lapsed_at"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lapsed))
    pid = lost.get("agent_pid")
    return [
        "Root cause (a lost node):",
        f"  node      : {lost['node']}",
        f"  host      : {lost['host']}"
        + (f" (its agent, pid {pid}, stopped answering)" if pid else ""),
        f"  last heard: {lost['last_heard_before']:g}s or less before its lease lapsed, at {when}",
        then,
    ]


def _describe_exit(failure: WorkerFailure) -> str:
    if failure.oom is not None:
        return f"{failure.exitcode} ({failure.signal_name()}: out of memory)"
    if failure.signal_name():
        return f"{failure.exitcode} ({failure.signal_name()})"
    return str(failure.exitcode)
