"""Where a job's shape comes from when a scheduler started it: Slurm's or Kubernetes'
environment read into the rendezvous options the user did not give (``--scheduler``)."""

SCHEDULERS = ("auto", "slurm", "kubernetes", "none")
"""``--scheduler``'s choices (:mod:`agentd.schedulers.detect`)."""
