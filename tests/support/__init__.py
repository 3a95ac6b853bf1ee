"""What several test files share: commands, HTTP clients, a workload that fills every list."""
