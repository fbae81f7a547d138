"""The workers' c10d store: torch's TCPStore wire protocol, served by group rank 0's agent
for each attempt."""
