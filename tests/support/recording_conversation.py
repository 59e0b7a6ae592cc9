"""A conversation stand-in that records the control requests a command
sends (no server): the chat's and the CLI's tests build on it."""

from __future__ import annotations

from typing import Any


class RecordingConversation:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    async def steer(self, text: str) -> None:
        self.sent.append(("steer", text))

    async def follow_up(self, text: str) -> None:
        self.sent.append(("follow_up", text))

    async def abort(self) -> None:
        self.sent.append(("abort",))

    async def stop_after_turn(self) -> None:
        self.sent.append(("stop_after_turn",))
