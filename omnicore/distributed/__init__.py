"""Parallel state (one DeviceMesh with named dims) and process-group lifecycle."""
