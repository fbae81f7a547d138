"""``agentd status``: ask a running agent's health endpoint, print it for people or scripts.

Plain ``urllib``, so it starts fast and works in a container probe (``exec`` probes and the
Dockerfile's HEALTHCHECK use ``agentd status --check livez``).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.error
from typing import Any

from agentd.support.agent_url import base_url, fetch


def run(
    url: str | None,
    as_json: bool,
    check: str | None,
    timeout: float,
    cacert: str | None = None,
    job: str | None = None,
    watch: float | None = None,
) -> int:
    """The ``status`` command; returns its exit code (0 ok, 1 unhealthy, 3 unreachable).
    ``job`` (a URL, or '' for ``url``'s): the job view instead (:mod:`.job_cli`)."""
    url = job or url
    base = base_url(url, dict(os.environ))
    if job is None and watch is not None:
        sys.stderr.write("agentd: error: --watch: redraws the job view only: add --job\n")
        return 2
    if job is not None:
        if check:
            sys.stderr.write("agentd: error: --check: a probe of one agent, not with --job\n")
            return 2
        from agentd.health import job_cli

        return job_cli.run(base, as_json, watch, timeout, cacert)
    path = f"/{check}" if check else "/status"
    try:
        code, body = fetch(base + path, timeout, cacert)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        hint = ""
        if url is None and not os.environ.get("AGENTD_STATUS_URL"):
            hint = (
                "; the health endpoint is off unless the agent runs with --health-port "
                "(or AGENTD_HEALTH_PORT): start it so, or pass that agent's URL"
            )
        sys.stderr.write(f"agentd: error: cannot reach the agent at {base}: {reason}{hint}\n")
        return 3
    if check:
        sys.stdout.write(body.decode(errors="replace"))
        return 0 if code == 200 else 1
    if code != 200:
        sys.stderr.write(f"agentd: error: {base}/status answered {code}\n")
        return 1
    try:
        doc = json.loads(body)
        render(doc)
    except (ValueError, KeyError, TypeError):
        sys.stderr.write(f"agentd: error: {base}/status did not answer agentd's status JSON\n")
        return 3
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if as_json else render(doc))
    return 0


def render(doc: dict[str, Any]) -> str:
    """The status as a short report and a table of workers."""
    watchdog = doc.get("watchdog") or {}
    lines = [
        f"run {doc['run_id']}  role {doc['role']}  state {doc['state']}  "
        f"host {doc['host']} (agent pid {doc['agent_pid']})",
        f"node rank {doc['node_rank']} of {doc['group_world_size']}  world size "
        f"{doc['world_size']}  generation {doc['generation']}  restarts "
        f"{doc['restart_count']}/{doc['max_restarts']}  up {_age(doc['started_at'])}",
        f"watchdog {'alive' if watchdog.get('alive') else 'NOT ALIVE'}, "
        f"{watchdog.get('timers', 0)} timer(s), {watchdog.get('reaped', 0)} reaped",
        "",
        f"{'LOCAL':>5} {'RANK':>5} {'PID':>8} {'STATE':<8} {'UP':>8} {'CPU s':>9} {'RSS MiB':>8}",
    ]
    for w in doc.get("workers", []):
        state = w["state"] if w["exitcode"] is None else f"exit {w['exitcode']}"
        lines.append(
            f"{w['local_rank']:>5} {w['rank']:>5} {w['pid']:>8} {state:<8} "
            f"{_age(w['started_at']):>8} {w['cpu_seconds']:>9.2f} {w['rss_bytes'] / 2**20:>8.1f}"
        )
    restarts = doc.get("recent_restarts") or []
    if restarts:
        lines += ["", "recent restarts:"]
        for entry in restarts[-5:]:
            when = time.strftime("%H:%M:%S", time.localtime(entry["at"]))
            if entry["reason"] == "membership":
                what = "re-formed for a membership change (no restart spent)"
            else:
                what = f"restart {entry['restart_count']}: {entry['cause'] or entry['reason']}"
            lines.append(f"  {when}  {what}")
    failure = doc.get("last_failure")
    if failure:
        what = failure["signal"] or f"exit code {failure['exitcode']}"
        lines += [
            "",
            f"last failure: rank {failure['rank']} (pid {failure['pid']}) {what}"
            + (f": {failure['message']}" if failure["message"] else ""),
        ]
    return "\n".join(lines) + "\n"


def _age(since: float) -> str:
    seconds = max(0, int(time.time() - since))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
