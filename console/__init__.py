"""Live clients of a conversation: follow its event stream, render it, chat."""

from client import follow
from console.chat import chat
from console.render import EventRenderer, json_line
from console.watch import watch

__all__ = ["EventRenderer", "chat", "follow", "json_line", "watch"]
