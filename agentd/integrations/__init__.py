"""Heartbeats and sections for the trainers people use, one line each.

- PyTorch Lightning: ``Trainer(callbacks=[agentd.integrations.lightning.HeartbeatCallback()])``
- Hugging Face: ``Trainer(..., callbacks=[agentd.integrations.transformers.HeartbeatCallback()])``

Each module imports its library only when it is imported itself, and every call it makes
is a no-op when the job does not run under agentd.
"""
