"""What a scheduler's environment says about a job, as the options ``agentd run`` would be
given: the values, the variables each was read from, and the line the agent prints.

Both schedulers place the job the same way (:func:`place`): the first host serves the
store on a port known to every node; the first three are its candidates, so the store
outlives its host; every node names itself by the name its peers know it by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentd.exceptions import ConfigError
from agentd.support.net import endpoint_text, is_loopback

STORE_CANDIDATES = 3
"""How many of the job's first hosts stand as the store's candidates."""


@dataclass(frozen=True)
class Detected:
    """A scheduler's answer: option values (raw text, as flags give them) and their origin."""

    scheduler: str
    """``Slurm`` or ``Kubernetes``."""
    job: str
    """How the start line names the job: ``Slurm job 1234``, ``Kubernetes Job train``."""
    values: Mapping[str, str] = field(default_factory=dict)
    read_from: Mapping[str, str] = field(default_factory=dict)
    """Option name -> the variables its value was read from."""

    def source(self, name: str) -> str:
        """Where option ``name`` came from, as errors name a value's source."""
        return f"{self.scheduler} ({self.read_from[name]})"


@dataclass(frozen=True)
class Placement:
    """Where one node of a job stands: the job's hosts (its first ones, at least), its own
    name among them, its index, and the job's size."""

    hosts: Sequence[str]
    this_host: str
    index: int
    nodes: int
    port: int
    hosts_from: str
    """The variables the hosts were read from (for the sources of the store's options)."""


NOT_A_LIST = ("", "all", "none", "void", "-1")
"""Values of a devices variable that are no list of this node's GPUs."""


def visible_gpus(environ: Mapping[str, str], *names: str) -> tuple[str, int] | None:
    """The first of ``names`` that lists GPUs (``0,1`` or UUIDs), and how many."""
    for name in names:
        text = environ.get(name, "").strip()
        if text.lower() in NOT_A_LIST:
            continue
        devices = [d for d in text.split(",") if d.strip()]
        if devices:
            return name, len(devices)
    return None


def standalone(given: Mapping[str, str]) -> bool:
    """The user asked for a job of this node alone (``--standalone``): the scheduler's
    other nodes and hosts are not read, so a shell inside an allocation (``salloc``,
    ``kubectl exec``) can run one."""
    return given.get("standalone", "false").lower() in ("1", "true", "yes", "on")


def place(
    placement: Placement, given: Mapping[str, str], job: str, token_hint: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The rendezvous options for one node of a multi-node job, and where each came from.

    ``given`` holds the options the user set (their raw text); what they set is theirs,
    and what it implies is followed: ``--standalone`` asks for nothing; an explicit
    ``--rdzv-backend static`` gets a fixed size, a node rank and rank 0's address; etcd
    gets no store endpoint (etcd's members are the user's to name), and neither does a
    job whose endpoint is given (nor does it need a token for one it would not use)."""
    if standalone(given):
        return {}, {}
    values: dict[str, str] = {}
    read_from: dict[str, str] = {}
    hosts, where = placement.hosts, placement.hosts_from
    backend = given.get("rdzv_backend", "agentd")
    if backend == "static":
        values.update(
            nnodes=str(placement.nodes), node_rank=str(placement.index), master_addr=hosts[0]
        )
        read_from.update(nnodes=where, node_rank=where, master_addr=where)
        return values, read_from
    values.update(
        nnodes=f"1:{placement.nodes}", rdzv_backend="agentd", local_addr=placement.this_host
    )
    read_from.update(nnodes=where, rdzv_backend=where, local_addr=where)
    if backend not in ("etcd", "etcd-v2") and "rdzv_endpoint" not in given:
        values["rdzv_endpoint"] = store_endpoint(
            hosts[:STORE_CANDIDATES],
            placement.port,
            bool(given.get("store_token")),
            job,
            token_hint,
        )
        read_from["rdzv_endpoint"] = where
    return values, read_from


def store_endpoint(
    candidates: Sequence[str], port: int, has_token: bool, job: str, token_hint: str
) -> str:
    """``--rdzv-endpoint`` for a job whose store may be served by ``candidates``.

    With a store token, all of them (``a:p,b:p,c:p``): one serves, the others take over.
    Without one, a store can only be served on loopback (its token then stays in a file
    of this machine), and one endpoint is given: members stand by as the job runs (the
    list grows). Off loopback with no token, nothing would be safe to serve."""
    endpoints = [endpoint_text(host, port) for host in candidates]
    if len(endpoints) == 1:
        return endpoints[0]
    if has_token:
        return ",".join(endpoints)
    if all(is_loopback(host) for host in candidates):
        return endpoints[0]
    raise ConfigError(
        f"--store-token: {job} runs on several hosts, and its rendezvous store is served "
        f"off loopback ({candidates[0]}), so every agent needs the same token: {token_hint}"
    )
