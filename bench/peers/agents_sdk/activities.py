"""The tool, as an activity the agent calls through ``activity_as_tool``."""

from __future__ import annotations

from temporalio import activity

from bench.peers.scenario import calculate


@activity.defn(name="calculator")
async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * /)."""
    return calculate(expression)
