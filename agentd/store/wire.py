"""What travels between the embedded store's clients and servers besides the JSON bodies:
headers, status codes and limits both sides agree on (see :mod:`agentd.store.server` and
:mod:`agentd.store.http_client`)."""

from __future__ import annotations

import base64

from agentd.store.api import (
    StoreAuthError,
    StoreError,
    StoreFull,
    StoreNotServing,
    StoreTimeout,
)

TERM_HEADER = "Agentd-Store-Term"
"""The highest candidate term a client or server has seen (candidate stores)."""
CANDIDATES_HEADER = "Agentd-Store-Candidates"
"""A fingerprint of the client's candidate list: a server with another list refuses it."""
NOT_SERVING = 421
"""The HTTP status of a store operation sent to a candidate that stands by."""
INSTANCE_HEADER = "Agentd-Store-Instance"
"""Names a server's state: a client sees a restart (state lost) when it changes."""
MAX_POLL = 60.0
"""The longest a wait or watch may block on the server; clients split longer ones."""
CANDIDATE_COUNT_HEADER = "Agentd-Store-Candidate-Count"
"""How many candidates a growing list holds (see :mod:`agentd.store.standby`): a client
whose list is shorter asks the server for the rest."""
CANDIDATE_LIST_HEADER = "Agentd-Store-Candidate-List"
"""A fingerprint of the growing list the serving candidate holds: a client whose own is
another version, or a fork, tells it its list and takes its answer's."""
ABSENT_HEADER = "Agentd-Store-Absent"
"""The indexes of the candidates that the serving one of a growing list has not heard
lately (comma-separated; see :mod:`agentd.store.contact`): a client's search does not
wait out their probe timeout once every other candidate has answered."""
MAX_CONNECTIONS = 65536
"""The most connections a store server takes: an agent holds two while its job runs (a
long poll, and its heartbeat's between beats) and a third for a moment, so 16,384 agents
hold about 33,000. The open-files limit caps it lower where it is lower (see
:mod:`agentd.support.fdlimits`: 20,000 descriptors serve about 9,000 agents). Here, not in
the server, as an agent that may stand by sizes its server before it loads one."""
INHERIT_MAX_BODY = 128 << 20
"""The bytes an authorized ``inherit`` body may hold (any other request's: 4 MiB): a
store's whole state, under 1 KiB a node as sent (``bench/bench_handdown.py``), up to the
64 MiB of keys and values a store holds at most, its values in base64."""
MAX_KEYS = 4096
"""The most keys one request may name (``multi_get``, ``multi_set``); clients split
longer reads."""
MAX_PRESENT = 32768
"""The most keys a ``compare_set`` may require to exist (a round's members' heartbeats:
one step, so never split; about 2 MB of keys, within the server's 4 MB body)."""


def b64(value: bytes | None) -> str | None:
    """A value as the JSON bodies carry it (base64; None stays None)."""
    return None if value is None else base64.b64encode(value).decode()


def unb64(value: str | None) -> bytes | None:
    """A value from a JSON body of ours (the server checks a client's, see ``ops``)."""
    return None if value is None else base64.b64decode(value)


def index_list(text: str) -> frozenset[int]:
    """The indexes a header such as :data:`ABSENT_HEADER` lists (what is not one is left
    out)."""
    return frozenset(int(part) for part in text.split(",") if part.isdigit() and len(part) < 4)


def refusal(status: int, where: str, op: str, message: str) -> StoreError:
    """The error a store server's answer of ``status`` (not 200) to ``op`` stands for;
    ``where`` names the server, ``message`` is its ``error``."""
    if status == 401:
        return StoreAuthError(f"{where} refused our token: {message}")
    if status == 408:
        return StoreTimeout(message)
    if status == NOT_SERVING:
        return StoreNotServing(f"{where}: {message}")
    if status == 507:
        return StoreFull(f"{where} refused {op}: {message}")
    return StoreError(f"{where} refused {op} ({status}): {message}")
