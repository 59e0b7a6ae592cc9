"""Output for rich while prompt_toolkit reads a line below it.

prompt_toolkit's ``patch_stdout`` prints whole lines above the input prompt,
but a partial line (tokens still streaming) would be drawn over by the
prompt. So this writer passes on finished lines only and holds the line in
progress back as ``tail``, which the chat shows inside its prompt until the
line ends. Long lines are cut at the terminal width (as the terminal would
wrap them), so the tail always fits on one screen line.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import TextIO

from prompt_toolkit.utils import get_cwidth

_SGR = re.compile(r"(\x1b\[[0-9;]*m)")
_RESETS = ("\x1b[0m", "\x1b[m")


class AbovePromptWriter(io.TextIOBase):
    """A text file that writes finished lines to ``out`` (the patched stdout)
    and keeps the unfinished one, with its ANSI styles, in ``tail``."""

    def __init__(
        self, out: TextIO, *, on_tail_change: Callable[[], None], columns: Callable[[], int]
    ) -> None:
        self._out = out
        self._on_tail_change = on_tail_change
        self._columns = columns
        self._tail = ""
        self._tail_cells = 0
        self._style = ""  # SGR codes in effect at the end of the tail

    @property
    def tail(self) -> str:
        """The line being streamed (ANSI text), or ``""``."""
        return self._tail if self._tail_cells else ""

    def write(self, text: str) -> int:
        width = max(self._columns() - 1, 1)  # the last column would make the terminal wrap
        lines: list[str] = []
        for piece in _SGR.split(text):
            if _SGR.fullmatch(piece):
                self._tail += piece
                self._style = "" if piece in _RESETS else self._style + piece
                continue
            for char in piece:
                cells = get_cwidth(char)
                if char == "\n" or self._tail_cells + cells > width:
                    lines.append(self._take_line())
                if char != "\n":
                    self._tail += char
                    self._tail_cells += cells
        if lines:
            self._out.write("".join(lines))
        self._on_tail_change()
        return len(text)

    def end_line(self) -> None:
        """Pass on the unfinished line (when the chat ends mid-stream)."""
        if self._tail_cells:
            self._out.write(self._take_line())
            self._on_tail_change()

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()

    def _take_line(self) -> str:
        """The tail as a finished line; the next line starts in the same style."""
        line = self._tail + ("\x1b[0m" if self._style else "") + "\n"
        self._tail, self._tail_cells = self._style, 0
        return line
