"""``agentd status --job``: ask any agent's health endpoint for the job view (``/job``),
print it for people (:mod:`agentd.jobview.table`) or scripts (``--json``), once or
redrawn in place every few seconds (``--watch``).

A watch started before its agent answers (the job just launched) waits for it, saying so,
until Ctrl-C. It goes on until the agent's run ends (it draws the final view and exits 0:
the agent's end waits for it, :class:`agentd.support.followers.Followers`), until the
agent stops answering without an end (killed, its host lost: exit 3, the last view left
on the screen) or until interrupted. The store not answering the view (a failover) is
said on the last view's screen, and the watch goes on.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.error
from typing import Any

from agentd.jobview.table import render_job
from agentd.support.agent_url import fetch
from agentd.support.followers import FOLLOW_HEADER, LONGEST

CLEAR = "\x1b[H\x1b[2J"
"""Cursor home and clear screen: a redraw in place on any ANSI terminal."""


def run(base: str, as_json: bool, watch: float | None, timeout: float, cacert: str | None) -> int:
    """The command; its exit code (0 ok, 1 the agent could not read the view, 3
    unreachable). ``watch``: redraw every that many seconds."""
    if watch is not None and not 0.1 <= watch <= 3600:
        sys.stderr.write(f"agentd: error: --watch: {watch!r} must be within 0.1..3600 seconds\n")
        return 2
    headers = {FOLLOW_HEADER: f"{watch:g}"} if watch is not None else None
    shown = ""  # the last view drawn
    waiting = ""  # when a watch began to wait for an agent that never answered yet
    while True:
        try:
            code, body = fetch(base + "/job", timeout, cacert, headers)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if shown:
                why = (
                    f"before its run ended ({reason}): killed, or its host lost?"
                    if watch is not None and watch <= LONGEST
                    else f"({reason}; its run's end waits for a watch every {LONGEST:g} s or less)"
                )
                sys.stderr.write(
                    f"agentd: error: the agent at {base} stopped answering at "
                    f"{time.strftime('%H:%M:%S')} {why} The view above is the last it gave\n"
                )
                return 3
            if watch is not None:  # started before its agent, or before it listens: wait
                waiting = waiting or time.strftime("%H:%M:%S")
                sys.stdout.write(
                    f"{CLEAR}{time.strftime('%H:%M:%S')}  {base}/job\n\nwaiting since "
                    f"{waiting} for the agent to answer ({reason}); Ctrl-C to stop\n"
                )
                sys.stdout.flush()
                if _slept(watch):
                    continue
            sys.stderr.write(f"agentd: error: cannot reach the agent at {base}: {reason}\n")
            return 3
        doc = _json(body)
        if code == 503 and watch is not None and doc is not None:  # the store: ask again
            text = shown + f"\n(the view is not new: {doc.get('error') or 'answered 503'})\n"
        elif code != 200 or doc is None or not (text := _text(doc, as_json)):
            error = doc.get("error") if isinstance(doc, dict) else None
            why = error or ("answered 404: an agent older than the job view" if code == 404 else "")
            sys.stderr.write(f"agentd: error: {base}/job: {why or f'answered {code}'}\n")
            return 1
        else:
            shown = text
        if watch is None:
            sys.stdout.write(text)
            return 0
        sys.stdout.write(CLEAR + time.strftime("%H:%M:%S  ") + f"{base}/job\n\n" + text)
        sys.stdout.flush()
        if code == 200 and doc.get("ended"):
            return 0
        if not _slept(watch):
            return 0


def _slept(seconds: float) -> bool:
    """Sleep ``seconds``; False where Ctrl-C ended the sleep."""
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        return False
    return True


def _json(body: bytes) -> dict[str, Any] | None:
    """The JSON object an answer holds (None: none)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _text(doc: dict[str, Any], as_json: bool) -> str:
    """``doc`` as printed ('': not a job view)."""
    if as_json:
        return json.dumps(doc, indent=2) + "\n"
    try:
        return render_job(doc)
    except (KeyError, TypeError, ValueError):
        return ""
