"""Live clients of a conversation: render its events, watch them, chat."""

from console.chat import chat
from console.render import EventRenderer, json_line
from console.watch import watch

__all__ = ["EventRenderer", "chat", "json_line", "watch"]
