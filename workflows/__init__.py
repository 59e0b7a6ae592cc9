"""Deterministic workflow code: the agent loop and the session."""
