"""``agentd status --job``: ask any agent's health endpoint for the job view (``/job``),
print it for people (:mod:`agentd.jobview.table`) or scripts (``--json``), once or
redrawn in place every few seconds (``--watch``) until interrupted."""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error

from agentd.jobview.table import render_job
from agentd.support.agent_url import fetch

CLEAR = "\x1b[H\x1b[2J"
"""Cursor home and clear screen: a redraw in place on any ANSI terminal."""


def run(base: str, as_json: bool, watch: float | None, timeout: float, cacert: str | None) -> int:
    """The command; its exit code (0 ok, 1 the agent could not read the view, 3
    unreachable). ``watch``: redraw every that many seconds."""
    if watch is not None and not 0.1 <= watch <= 3600:
        sys.stderr.write(f"agentd: error: --watch: {watch!r} must be within 0.1..3600 seconds\n")
        return 2
    while True:
        try:
            code, body = fetch(base + "/job", timeout, cacert)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            sys.stderr.write(f"agentd: error: cannot reach the agent at {base}: {reason}\n")
            return 3
        try:
            doc = json.loads(body)
            text = json.dumps(doc, indent=2) + "\n" if as_json else render_job(doc)
        except (ValueError, KeyError, TypeError):
            doc, text = None, ""
        if code != 200 or doc is None:
            error = doc.get("error") if isinstance(doc, dict) else None
            why = error or ("answered 404: an agent older than the job view" if code == 404 else "")
            sys.stderr.write(f"agentd: error: {base}/job: {why or f'answered {code}'}\n")
            return 1
        if watch is None:
            sys.stdout.write(text)
            return 0
        sys.stdout.write(CLEAR + time.strftime("%H:%M:%S  ") + f"{base}/job\n\n" + text)
        sys.stdout.flush()
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return 0
