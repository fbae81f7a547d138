"""What a run leaves behind for people and tools: error files (@record), the failure report
and result.json, the event log, and torch's metrics and events APIs."""
