"""Steering and follow-up queues (pi's ``one-at-a-time`` and ``all`` modes)."""

from __future__ import annotations

from workflows.models import AgentMessage, QueueMode


class MessageQueue:
    """A FIFO of messages drained by ``poll`` according to its mode. Each
    message keeps its arrival number (from a counter shared with the other
    queue), so messages cleared from both queues come back in arrival order."""

    def __init__(
        self, mode: QueueMode, messages: list[AgentMessage] | None = None, arrivals: list[int] | None = None
    ) -> None:
        self.mode: QueueMode = mode
        self._messages: list[AgentMessage] = list(messages or [])
        self.arrivals: list[int] = list(arrivals or [])
        if len(self.arrivals) != len(self._messages):  # carried by an older version
            self.arrivals = [getattr(m, "timestamp", 0) or 0 for m in self._messages]

    def push(self, message: AgentMessage, arrival: int = 0) -> None:
        self._messages.append(message)
        self.arrivals.append(arrival)

    def poll(self) -> list[AgentMessage]:
        """Drain one message (``one-at-a-time``) or all of them (``all``)."""
        if not self._messages:
            return []
        if self.mode == "all":
            drained, self._messages, self.arrivals = self._messages, [], []
            return drained
        self.arrivals.pop(0)
        return [self._messages.pop(0)]

    def clear(self) -> list[tuple[int, AgentMessage]]:
        """Remove every queued message; ``(arrival, message)``, oldest first."""
        removed = list(zip(self.arrivals, self._messages, strict=True))
        self._messages, self.arrivals = [], []
        return removed

    def snapshot(self) -> list[AgentMessage]:
        return list(self._messages)

    def __len__(self) -> int:
        return len(self._messages)
