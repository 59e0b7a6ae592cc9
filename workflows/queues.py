"""Steering and follow-up queues (pi's ``one-at-a-time`` and ``all`` modes)."""

from __future__ import annotations

from workflows.models import AgentMessage, QueueMode


class MessageQueue:
    """A FIFO of messages drained by ``poll`` according to its mode."""

    def __init__(self, mode: QueueMode, messages: list[AgentMessage] | None = None) -> None:
        self.mode: QueueMode = mode
        self._messages: list[AgentMessage] = list(messages or [])

    def push(self, message: AgentMessage) -> None:
        self._messages.append(message)

    def poll(self) -> list[AgentMessage]:
        """Drain one message (``one-at-a-time``) or all of them (``all``)."""
        if not self._messages:
            return []
        if self.mode == "all":
            drained, self._messages = self._messages, []
            return drained
        return [self._messages.pop(0)]

    def clear(self) -> list[AgentMessage]:
        """Remove and return every queued message, oldest first."""
        removed, self._messages = self._messages, []
        return removed

    def snapshot(self) -> list[AgentMessage]:
        return list(self._messages)

    def __len__(self) -> int:
        return len(self._messages)
