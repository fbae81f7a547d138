"""The worker processes: their plan (environment, argv, log routes), spawning, output
(logs, tee, filters), the one stop policy, and the function-entrypoint runner."""
