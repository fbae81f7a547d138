"""Options that were given but do nothing here, said in one WARNING each before anything
starts: torchrun takes them as silently, so a store meant to be met, a malformed
endpoint or a console filter that matches no worker passed unseen."""

from __future__ import annotations

import logging

from agentd.config.resolve import AgentConfig

log = logging.getLogger(__name__)


def say_what_is_unheeded(config: AgentConfig, backend: str, nproc: int) -> None:
    """Warn of each option of ``config`` that the ``backend`` rendezvous, or a node of
    ``nproc`` workers, does not use."""
    if config.standalone:
        _standalone(config)
    static = backend == "static"
    if config.master_addr and not static:
        log.warning(
            "--master-addr is ignored by the %s rendezvous: group rank 0's address is used",
            backend,
        )
    if static and config.rdzv_endpoint and (config.master_addr or config.master_port):
        log.warning(
            "--master-addr/--master-port are ignored: the static rendezvous meets at "
            "--rdzv-endpoint %s (as torchrun's does)",
            config.rdzv_endpoint,
        )
    _ranks_filter(config, nproc)
    _needs(config)


def _standalone(config: AgentConfig) -> None:
    """A rendezvous backend or endpoint given with ``--standalone``, which meets no other
    node: named with where it came from and its value."""
    given = {"rdzv_backend": config.rdzv_backend, "rdzv_endpoint": config.rdzv_endpoint}
    sources = config.sources
    ignored = [f"{sources[name]} {value!r}" for name, value in given.items() if name in sources]
    if ignored:
        log.warning(
            "%s ignored: --standalone meets no other node (it serves its own store on "
            "127.0.0.1, as torchrun's does)",
            " and ".join(ignored),
        )


NEEDS = (
    (
        ("health_host", "health_timeout", "health_cert", "health_key", "drain_token"),
        "health_port",
        "no health endpoint is served without --health-port",
    ),
    (
        ("node_check_interval", "node_check_cooldown", "node_check_max_exclusions"),
        "node_check",
        "no node check runs without --node-check",
    ),
    (
        ("timer_file",),
        "file_timer",
        "the timer pipe is served only with --file-timer (as torch's agents serve it only "
        "with TORCHELASTIC_ENABLE_FILE_TIMER=1)",
    ),
)
"""Options that shape a part another option turns on: (the options, the one that turns
the part on, why they are ignored without it)."""


def _needs(config: AgentConfig) -> None:
    """Options of a part nothing turned on, one WARNING a part: named with where each came
    from (not their values: the drain token is a secret)."""
    for names, needed, why in NEEDS:
        given = [config.sources[name] for name in names if name in config.sources]
        turned_on = getattr(config, needed)
        if given and (turned_on is None or turned_on is False or turned_on == ()):
            log.warning("%s ignored: %s", " and ".join(given), why)


def _ranks_filter(config: AgentConfig, nproc: int) -> None:
    """A ``--local-ranks-filter`` naming local ranks this node's workers do not have."""
    ranks = config.local_ranks_filter or frozenset()
    beyond = sorted(r for r in ranks if r >= nproc)
    if not beyond:
        return
    shown = sorted(r for r in ranks if r < nproc)
    log.warning(
        "--local-ranks-filter: local rank(s) %s are not among this node's %d worker(s) (0..%d): %s",
        beyond,
        nproc,
        nproc - 1,
        f"only {shown} shown on the console" if shown else "no worker's output is shown",
    )
