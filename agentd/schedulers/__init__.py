"""Where a job's shape comes from when a scheduler started it: Slurm's or Kubernetes'
environment read into the rendezvous options the user did not give (``--scheduler``).

``auto`` (the default) reads Slurm's when ``SLURM_JOB_ID`` is set, else Kubernetes' in a
pod of an Indexed Job (``JOB_COMPLETION_INDEX`` and ``KUBERNETES_SERVICE_HOST`` set);
``slurm`` and ``kubernetes`` insist (a missing variable is an error); ``none`` reads
nothing. Each scheduler's module is imported only when its variables are there, so every
job loads this package and nothing more of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentd.schedulers.detected import Detected

SCHEDULERS = ("auto", "slurm", "kubernetes", "none")
"""``--scheduler``'s choices (:func:`detect`)."""


def detect(choice: str, environ: Mapping[str, str], given: Mapping[str, str]) -> Detected | None:
    """What the scheduler ``choice`` says about this job (None: no scheduler)."""
    slurm = bool(environ.get("SLURM_JOB_ID", "").strip() or environ.get("SLURM_JOBID", "").strip())
    if choice == "slurm" or (choice == "auto" and slurm):
        from agentd.schedulers.slurm import detect_slurm

        return detect_slurm(environ, given)
    pod = "JOB_COMPLETION_INDEX" in environ and "KUBERNETES_SERVICE_HOST" in environ
    if choice == "kubernetes" or (choice == "auto" and pod):
        from agentd.schedulers.kubernetes import detect_kubernetes

        return detect_kubernetes(environ, given)
    return None
