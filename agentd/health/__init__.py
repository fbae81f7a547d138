"""The health endpoint: /livez /readyz /status /metrics, its Prometheus metrics, and the
`agentd status` command."""
