"""Activity heartbeats: sent by a running activity, never by a local one."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import activities.heartbeat as heartbeat_module
from activities.heartbeat import HEARTBEAT_EVERY, heartbeating
from workflows.calls import HEARTBEAT_TIMEOUT


async def _beats(
    monkeypatch: pytest.MonkeyPatch, *, is_local: bool, every: float = 0.01, body_seconds: float = 0.1
) -> list[Any]:
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_EVERY", every)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, is_local=is_local)
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    async def body() -> None:
        async with heartbeating():
            await asyncio.sleep(body_seconds)

    await env.run(body)
    return beats


async def test_an_activity_heartbeats_while_its_body_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(await _beats(monkeypatch, is_local=False)) >= 3


async def test_a_body_shorter_than_the_interval_sends_no_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each heartbeat is a call to the server; a quick tool or a short answer needs none.
    assert await _beats(monkeypatch, is_local=False, every=0.2, body_seconds=0.05) == []


async def test_a_local_activity_sends_no_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK would send it from a task of its own, possibly after the local
    # activity completed, which blocks the worker (activities/heartbeat.py).
    assert await _beats(monkeypatch, is_local=True) == []


async def test_heartbeats_stop_when_the_body_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """An activity that failed sends no more heartbeats (its heartbeat task is not left running)."""
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_EVERY", 0.01)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, is_local=False)
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    async def body() -> None:
        async with heartbeating():
            await asyncio.sleep(0.05)
            raise ValueError("the tool failed")

    with pytest.raises(ValueError):
        await env.run(body)
    sent = len(beats)
    await asyncio.sleep(0.1)
    assert sent >= 1 and len(beats) == sent


def test_heartbeats_come_twice_a_second_well_within_the_heartbeat_timeout() -> None:
    """A live activity is never timed out for a missing heartbeat (the worker also throttles them to 1 s)."""
    assert HEARTBEAT_EVERY <= 0.5
    assert HEARTBEAT_EVERY + 1 < HEARTBEAT_TIMEOUT.total_seconds()
