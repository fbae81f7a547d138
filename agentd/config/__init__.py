"""The agent's configuration: the option table, value parsers, and the one resolution
(CLI flag > AGENTD_* > PET_* > TOML file > default) into an AgentConfig."""
