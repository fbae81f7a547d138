"""The agent: the torch-compatible template (SimpleElasticAgent), its rendezvous steps and
restart policy, and LocalElasticAgent, which runs the worker group as local processes."""
