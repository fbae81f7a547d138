"""The composition root of the local agent: every feature's settings in one record
(:mod:`~agentd.assembly.settings`), the one function that builds the services from them
(:mod:`~agentd.assembly.services`), and what the agent calls on each, as protocols
(:mod:`~agentd.assembly.ports`). The agent names no feature's class: it gets its services
from here and knows them by these protocols."""
