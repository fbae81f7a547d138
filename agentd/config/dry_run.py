"""``agentd run --dry-run``: every check of a start, then the options as resolved, and
nothing started (no store, no worker, no port).

Whoever writes a Slurm batch script or a Kubernetes manifest sees what one node's agent
would run with before any node is asked for: each option that is not its default, the
text it was given and where from (a flag, a variable, the config file or the scheduler's
environment), and what the agent chose from them (the scheduler's reading, how workers
start). The lines are a TOML config file that ``--config`` reads back; secrets (the
tokens, an etcd ``password=``) are named, never shown.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agentd.config.options import OPTIONS
from agentd.support.secrets import without_password

if TYPE_CHECKING:
    from agentd.config.resolve import AgentConfig
    from agentd.spec import WorkerSpec

SECRETS = ("store_token", "drain_token")
"""Options whose values are never printed."""


def dry_run_text(config: AgentConfig, spec: WorkerSpec) -> str:
    """The resolved options of ``config`` as a TOML file, with what ``spec`` would start."""
    from agentd.config.build import scheduler_line

    handler = spec.rdzv_handler
    lines = [
        "# agentd run --dry-run: every check passed; nothing was started.",
        f"# {spec.local_world_size} worker(s), rendezvous "
        f"{handler.get_backend() if handler else 'none'}, {spec.how_started()}",
    ]
    if config.detected is not None:
        lines.append(f"# {scheduler_line(config)}")
    lines += [f"script = {_toml(config.script)}", f"args = {_toml(list(config.script_args))}"]
    for option in OPTIONS:
        name = option.name
        if name not in config.given:
            continue
        source = config.sources[name]
        if name in SECRETS:
            lines.append(f"# {name}: set by {source} (a secret: not shown)")
            continue
        text = config.given[name]
        if name == "rdzv_conf":
            shown = without_password(text)
            if shown != text:
                source += "; its password is not shown"
            text = shown
        lines.append(f"{name} = {_toml(text)}  # {source}")
    return "\n".join(lines) + "\n"


def _toml(value: str | list[str]) -> str:
    """A TOML value: a JSON string is a TOML basic string, and a list of them an array."""
    return json.dumps(value, ensure_ascii=False)
