"""How another process (a killed agent's guardian, carrying out its will) reaches the
store an agent's :class:`~agentd.store.failover.FailoverStore` talks to: a JSON spec of
that client, and a client or prober made from one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.store.candidates import Prober
    from agentd.store.failover import FailoverStore
    from agentd.store.tls import StoreTls


def client_spec(client: FailoverStore) -> dict[str, Any]:
    """What :func:`client_from_spec` needs to reach ``client``'s store from another process
    (JSON; it holds the token, so it is only ever passed on a private pipe). The token is
    the one ``client`` sends: on loopback without one given, the one the seed published,
    which a client made from the spec could not find for another candidate's port (a
    killed member's guardian was refused everywhere after a failover)."""
    tls = client.tls
    return {
        "endpoints": list(client.endpoints),
        "growing": client.growing,
        "serving": client.serving,
        "term": client.term,
        "list_term": client.list_term,
        "absent": sorted(client.absent),
        "token": client.token or "",
        "tls": None if tls is None else [tls.cacert, tls.cert, tls.key],
    }


def _tls_from_spec(spec: dict[str, Any]) -> StoreTls | None:
    from agentd.store.tls import StoreTls

    files = spec.get("tls")
    return StoreTls(files[0], files[1], files[2], serve=False) if files else None


def prober_from_spec(spec: dict[str, Any]) -> Prober:
    """A prober of the candidates of the store :func:`client_spec` describes."""
    from agentd.store.candidates import Prober

    growing = bool(spec.get("growing"))
    return Prober(
        spec["endpoints"], spec.get("token") or "", growing=growing, tls=_tls_from_spec(spec)
    )


def client_from_spec(spec: dict[str, Any], timeout: float) -> FailoverStore:
    """A client of the store :func:`client_spec` describes, giving up after ``timeout``."""
    from agentd.store.candidates import list_term
    from agentd.store.failover import FailoverStore

    tls = _tls_from_spec(spec)
    serving = spec.get("serving")
    start = serving if isinstance(serving, int) and 0 <= serving < len(spec["endpoints"]) else None
    term = spec.get("term")
    absent = spec.get("absent")
    return FailoverStore(
        spec["endpoints"],
        spec.get("token") or None,
        growing=bool(spec.get("growing")),
        retry_timeout=timeout,
        request_timeout=timeout / 2,
        alone_request_timeout=timeout / 2,
        tls=tls,
        start=start,
        term=term if isinstance(term, int) and term > 0 else 0,
        absent=[i for i in absent if isinstance(i, int)] if isinstance(absent, list) else (),
        list_term=list_term(spec.get("list_term")),
    )
