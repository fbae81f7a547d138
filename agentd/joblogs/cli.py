"""``agentd logs [URL]``: every node's worker lines, merged in time order, each prefixed
``host:rank aN|`` (N: the attempt).

The agent at URL (any agent's health endpoint) names its round's nodes and where each
serves its own (``/job``); each node is asked for its lines (``GET /logs``, with the
health token: ``AGENTD_DRAIN_TOKEN``, or a local agent's published one). ``--follow``
asks again every second and prints lines once a second old, so the nodes' lines stay in
order as they arrive, until every node's agent has said that its lines ended (exit 0; its
end waits for the follower: :class:`agentd.support.followers.Followers`) or is gone without
saying so (exit 3, each named as it goes), reading the round's nodes again every
:data:`REFRESH` to follow one that joined; ``--rank``, ``--node`` and ``--since`` narrow
what is shown.
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from agentd.drain.http import DRAIN_TOKEN_ENV
from agentd.joblogs.errors import LogsError
from agentd.joblogs.reader import LogLine
from agentd.store import token_file
from agentd.support.agent_url import base_url, fetch, read_endpoints, tls_context
from agentd.support.followers import FOLLOW_HEADER

FOLLOW_EVERY = 1.0
HOLD = 1.0
"""With --follow, a line is printed once this old: a slower node's earlier lines first."""
ENDPOINT_ARGUMENTS = {"URL": "url_arg", "--url": "url", "--health-port": "health_port"}
"""The arguments that name an agent to ask, by the attribute each sets."""
REFRESH = 5.0
"""With --follow, how often the round's nodes are read again, for those that joined."""
_SINCE = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)\Z")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """``--since``: ``90``, ``90s``, ``10m``, ``2h`` or ``1d`` ago, as epoch seconds."""
    found = _SINCE.match(text.strip())
    if not found:
        raise LogsError(f"--since: {text!r} must be a time ago, like 90s, 10m, 2h or 1d", 2)
    return now - float(found.group(1)) * _UNIT[found.group(2)]


class Source:
    """One node: where it serves its lines, and the cursor of what was read."""

    def __init__(self, row: dict[str, Any], url: str, since: float | None) -> None:
        self.host = row.get("host") or row.get("node") or "?"
        self.node = row.get("node") or "?"
        self.url = url
        self.cursor = ""
        self.files = 0
        """How many log files the node's agent has."""
        self.keeps_files = True
        """Whether its agent writes its workers' output to files (their count may still be
        0: no worker started yet)."""
        self.placed_by = ""
        """The log specs class that places its workers' logs, where not agentd's layout."""
        self.since = since
        """Its lines from then on only (``--since``; a node that joined while followed:
        from when the follower began, at the latest)."""
        self.token = token_file.for_agent(url, os.environ.get(DRAIN_TOKEN_ENV))

    def ask(
        self, rank: int | None, timeout: float, cacert: str | None, follow: bool = False
    ) -> dict[str, Any]:
        """One ``GET /logs`` from the cursor, as a follower's where ``follow`` (LogsError
        with the exit code)."""
        query = {"cursor": self.cursor} if self.cursor else {}
        if self.since is not None:  # a file first read later starts there too
            query["since"] = f"{self.since:.3f}"
        if rank is not None:
            query["rank"] = str(rank)
        headers = {"Authorization": f"Bearer {self.token or ''}"}
        if follow:
            headers[FOLLOW_HEADER] = f"{FOLLOW_EVERY:g}"
        request = urllib.request.Request(
            f"{self.url}/logs?{urllib.parse.urlencode(query)}", headers=headers
        )
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=tls_context(self.url, cacert)
            ) as answer:
                doc = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            why = exc.read().decode(errors="replace").strip()
            hint = f" (give its token in {DRAIN_TOKEN_ENV})" if exc.code == 401 else ""
            raise LogsError(f"{self.url}/logs answered {exc.code}: {why}{hint}", 1) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LogsError(
                f"cannot reach {self.host}'s agent at {self.url}: {reason}", 3
            ) from None
        self.cursor = doc["cursor"]
        self.files = doc.get("files") or 0
        self.keeps_files = doc.get("keeps_files", self.files > 0)  # an older agent: its count
        self.placed_by = doc.get("placed_by") or ""
        return doc


def sources(
    base: str,
    node: str | None,
    timeout: float,
    cacert: str | None,
    since: float | None,
    again: bool = False,
) -> list[Source]:
    """The round's nodes from ``base``'s ``/job`` (those ``node`` names, when given), each
    to be read from ``since``;
    ``again``: read again while following, so nothing is said of a node that serves no
    endpoint, nor of ``node`` not found (it may join later)."""
    try:
        code, body = fetch(base + "/job", timeout, cacert)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise LogsError(
            f"cannot reach the agent at {base}: {getattr(exc, 'reason', exc)}", 3
        ) from None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    if code != 200:
        raise LogsError(f"{base}/job: {doc.get('error') or f'answered {code}'}", 1)
    found = []
    for row in doc["nodes"]:
        names = {str(row["group_rank"]), str(row.get("node")), str(row.get("host"))}
        if node is not None and node not in names:
            continue
        url = base if row["group_rank"] == doc.get("answered_by") else row.get("health")
        if url:
            found.append(Source(row, url.rstrip("/"), since))
        elif not again:
            sys.stderr.write(
                f"agentd: node {row['group_rank']} ({row.get('host') or 'unknown'}) serves no "
                "health endpoint: its lines are not shown (start its agent with --health-port)\n"
            )
    if node is not None and not found and not again:
        raise LogsError(f"--node: {node!r} is no node of round {doc['generation']}", 2)
    return found


def run(args: argparse.Namespace) -> int:
    """The command (:func:`agentd.cli.build_parser`'s ``logs`` arguments); its exit code
    (0, 1 an agent refused or a folder holds no log, 2 usage, 3 unreachable). A bad
    endpoint is a :class:`~agentd.exceptions.ConfigError`."""
    try:
        if args.rank is not None and args.rank < 0:
            raise LogsError(f"--rank: {args.rank} must be a global rank (>= 0)", 2)
        start = parse_since(args.since, time.time()) if args.since else None
        if args.dir is not None:
            return _from_folder(args, start)
        read_endpoints(args)
        base = base_url(args.url, dict(os.environ))
        nodes = sources(base, args.node, args.timeout, args.cacert, start)
        if not args.follow:
            batches = [_drain(source, args.rank, args.timeout, args.cacert)[0] for source in nodes]
            for _, _, text in heapq.merge(*batches):
                sys.stdout.write(text)
            _files_note(nodes)
            return 0
        return _follow(base, nodes, args.node, start, args.rank, args.timeout, args.cacert)
    except LogsError as exc:
        sys.stderr.write(f"agentd: error: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        return 0


def _from_folder(args: argparse.Namespace, since: float | None) -> int:
    """``--dir``: the run's folders' lines, read from disk (:mod:`.folders`)."""
    from agentd.joblogs.folders import folder_lines

    if args.follow:
        raise LogsError("--follow: asks running agents; --dir reads the files as they are", 2)
    if given := [f for f, v in ENDPOINT_ARGUMENTS.items() if getattr(args, v) is not None]:
        raise LogsError(f"{given[0]}: names an agent to ask; --dir reads files instead", 2)
    for _, _, text in folder_lines(args.dir, since, args.rank, args.node):
        sys.stdout.write(text)
    return 0


Timed = tuple[float, int, str]
"""A line to print: its time, its order among equal times, its text."""


def _drain(
    source: Source, rank: int | None, timeout: float, cacert: str | None, follow: bool = False
) -> tuple[list[Timed], bool]:
    """Every line ``source`` has (asking again while it says there is more), and whether
    its agent said that no more will come."""
    out: list[Timed] = []
    while True:
        doc = source.ask(rank, timeout, cacert, follow)
        out += [
            (line[0], len(out) + i, LogLine(*line).shown(source.host))
            for i, line in enumerate(doc["lines"])
        ]
        if not doc["more"]:
            return out, bool(doc.get("ended"))


def _files_note(nodes: list[Source]) -> None:
    """On stderr, a line for each node whose lines cannot be read: it keeps no log files,
    or its log specs put them where ``agentd logs`` does not read."""
    for source in nodes:
        if source.placed_by:
            sys.stderr.write(
                f"agentd: {source.host}'s workers write their output where "
                f"{source.placed_by}.reify puts it (--logs-specs); agentd logs reads "
                "agentd's own layout only\n"
            )
        elif not source.keeps_files:
            sys.stderr.write(
                f"agentd: {source.host} keeps no log files: its agent writes them with --tee 3 "
                "(or --redirects 3)\n"
            )


def _joined(
    asked: list[str],
    node: str | None,
    known: set[str],
    timeout: float,
    cacert: str | None,
    since: float,
) -> list[Source]:
    """The round's nodes not in ``known`` (node ids), read from the first agent of
    ``asked`` that answers (none where none does), each to be read from ``since``."""
    for url in asked:
        try:
            found = sources(url, node, timeout, cacert, since, again=True)
            return [source for source in found if source.node not in known]
        except LogsError:
            continue
    return []


def _follow(
    base: str,
    nodes: list[Source],
    node: str | None,
    since: float | None,
    rank: int | None,
    timeout: float,
    cacert: str | None,
) -> int:
    """Print the nodes' lines as they come, in time order, until every node's agent said
    its lines ended (0) or some went without saying so (3), or until interrupted. Every
    :data:`REFRESH` the round's nodes are read again (from ``base``, else a node still
    followed), and a node that joined is followed too: its lines from when the follower
    began (or ``since``)."""
    held: list[Timed] = []
    count = 0
    noted = False
    following, lost = list(nodes), False
    known = {source.node for source in nodes}
    began, refresh = time.time(), time.monotonic() + REFRESH
    while following:
        if time.monotonic() >= refresh:
            asked = [base, *(source.url for source in following)]
            from_then = began if since is None else since
            for source in _joined(asked, node, known, timeout, cacert, from_then):
                sys.stderr.write(f"agentd: {source.host} joined the round: its lines follow\n")
                following.append(source)
                known.add(source.node)
            refresh = time.monotonic() + REFRESH
        for source in list(following):
            try:
                lines, ended = _drain(source, rank, timeout, cacert, follow=True)
            except LogsError as exc:
                if exc.code != 3:
                    raise
                sys.stderr.write(f"agentd: error: {exc}: no more of its lines are shown\n")
                following.remove(source)
                lost = True
                continue
            for at, _, text in lines:
                heapq.heappush(held, (at, count, text))
                count += 1
            if ended:
                following.remove(source)
        if not noted:
            _files_note(nodes)
            noted = True
        ripe = time.time() - HOLD if following else math.inf  # at the end: every line
        while held and held[0][0] <= ripe:
            sys.stdout.write(heapq.heappop(held)[2])
        sys.stdout.flush()
        if following:
            time.sleep(FOLLOW_EVERY)
    return 3 if lost else 0
