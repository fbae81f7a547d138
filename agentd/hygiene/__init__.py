"""No orphans, ever: the child subreaper, the guardian that outlives a killed agent,
leftovers of a dead agent, and the descriptor limits."""
