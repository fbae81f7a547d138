"""Warm restarts: a preloaded zygote forks the workers (``--preload``).

The agent starts one zygote process per worker group while the rendezvous runs. It starts
the interpreter, imports the ``--preload`` modules once, and then only forks: every worker
is a fresh fork of the pristine zygote, which never runs user code, so a restart pays for
neither a new interpreter nor ``import torch``.

* :mod:`.command` reads a worker command line (``python [options] script|-m module``);
* :mod:`.wire` is the zygote's control channel (JSON messages carrying descriptors);
* :mod:`.zygote` is the zygote program, :mod:`.child` what a forked worker does before
  it runs the target as ``python`` would;
* :mod:`.client` is the agent's side: start, fork, watch through pidfds;
* :mod:`.auto` chooses what ``--preload auto`` preloads, from what
  :mod:`.source_reading` reads of the script's source;
* :mod:`.import_state` is what a preloaded library read of the zygote's process at
  import: recorded in the zygote, derived again in each forked worker.
"""
