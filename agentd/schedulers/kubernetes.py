"""A Kubernetes Indexed Job's shape (or a JobSet's replicated job), from what each pod
knows of itself.

An Indexed Job names its pods ``<job>-<index>`` and sets ``JOB_COMPLETION_INDEX``; with
the pod template's ``subdomain`` set to a headless Service, each pod is found at
``<job>-<index>.<service>...``, the full name the kubelet writes into the pod's
``/etc/hosts`` as its hostname's canonical name (:func:`canonical_name`). A JobSet names
its pods ``<jobset>-<replicated job>-<job index>-<index>`` under the same rule. From that: the run
id is the job's name, the store is served by pod 0 on :data:`PORT`, pods 0-2 are its
candidates, and each pod is its own full name. The job's size is not visible from a pod:
the manifest sets it (``AGENTD_NNODES``, the Job's ``completions``). A pod Kubernetes
replaces comes back under the same name, so the size given stays the job's size. The
workers per pod are its GPUs (``CUDA_VISIBLE_DEVICES``, else the device plugin's
``NVIDIA_VISIBLE_DEVICES``), else one.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping

from agentd.exceptions import ConfigError
from agentd.schedulers.detected import Detected, Placement, place, standalone, visible_gpus

PORT = 29400
"""The store's port: each pod has its own network, so every job may use the same one."""
TOKEN_HINT = (
    "set AGENTD_STORE_TOKEN from a Secret in the pod template (see deploy/kubernetes/job.yaml)"
)
INDEX_VAR = "JOB_COMPLETION_INDEX"


def detect_kubernetes(
    environ: Mapping[str, str],
    given: Mapping[str, str],
    hostname: Callable[[], str] = socket.gethostname,
    full_name: Callable[[], str] | None = None,
) -> Detected:
    """The options an Indexed Job's pod implies (ConfigError naming the variable, or the
    pod's name, when they contradict each other)."""
    text = environ.get(INDEX_VAR, "").strip()
    if not text:
        raise ConfigError(f"{INDEX_VAR}: not set; --scheduler kubernetes needs an Indexed Job")
    if not text.isdigit():
        raise ConfigError(f"{INDEX_VAR}: {text!r} must be a number (the pod's index)")
    index = int(text)
    name = hostname()
    suffix = f"-{index}"
    if not name.endswith(suffix) or len(name) == len(suffix):
        raise ConfigError(
            f"{INDEX_VAR}: {index}, but this pod's hostname {name!r} does not end in "
            f"{suffix!r}: agentd needs an Indexed Job's own pod names (no spec.hostname)"
        )
    job_name = name[: -len(suffix)]
    job = f"Kubernetes Job {job_name}"
    values = {"rdzv_id": job_name}
    read_from = {"rdzv_id": "the pod's hostname"}
    gpus = visible_gpus(environ, "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
    if gpus is not None:
        read_from["nproc_per_node"], count = gpus
        values["nproc_per_node"] = str(count)
    if standalone(given):
        return Detected("Kubernetes", job, values, read_from)
    nodes = _nodes(given.get("nnodes"))
    if nodes is None:
        raise ConfigError(
            "AGENTD_NNODES: not set; in Kubernetes the manifest sets it to the Job's "
            "completions (N, or MIN:N to go on without a lost pod)"
        )
    if index >= nodes:
        raise ConfigError(f"{INDEX_VAR}: {index} must be below the job's {nodes} nodes (nnodes)")
    if nodes == 1:
        return Detected("Kubernetes", job, values, read_from)
    full = (full_name or (lambda: canonical_name(name)))()
    if not full.startswith(name + ".") or len(full) == len(name) + 1:
        raise ConfigError(
            f"{INDEX_VAR}: this pod's full name is {full!r}, with no subdomain: set the pod "
            "template's subdomain to a headless Service selecting the Job's pods "
            "(see deploy/kubernetes/job.yaml)"
        )
    domain = full[len(name) + 1 :]
    hosts = [f"{job_name}-{i}.{domain}" for i in range(min(nodes, 3))]
    placement = Placement(hosts, full, index, nodes, PORT, f"{INDEX_VAR}, the pod's name")
    more, more_from = place(placement, given, job, TOKEN_HINT)
    return Detected("Kubernetes", job, {**values, **more}, {**read_from, **more_from})


def canonical_name(hostname: str) -> str:
    """The canonical name of ``hostname`` by a forward lookup (the first name of its
    /etc/hosts line in a pod); ``hostname`` itself when it has none."""
    try:
        infos = socket.getaddrinfo(
            hostname, None, type=socket.SOCK_STREAM, flags=socket.AI_CANONNAME
        )
    except OSError:
        return hostname
    return next((info[3] for info in infos if info[3]), hostname)


def _nodes(text: str | None) -> int | None:
    """The most nodes of ``N`` or ``MIN:MAX`` (None when unset or not one: the option's
    own parser names a bad value)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text or "")
    if not match:
        return None
    return int(match.group(2) or match.group(1))
