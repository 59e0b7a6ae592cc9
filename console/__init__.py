"""Live clients of a conversation: render its events, watch them, chat."""

from console.chat import chat
from console.render import EventRenderer, json_line, skipped_note
from console.watch import approval_hint, watch

__all__ = ["EventRenderer", "approval_hint", "chat", "json_line", "skipped_note", "watch"]
