"""Example tools that ship with the worker: a calculator, and a file reader
and lister confined to a workspace directory (``AGENT_WORKSPACE``, default:
the worker's working directory; the worker sets it with ``set_workspace``).

Each is bounded in time and memory whatever the model asks: the
calculator refuses a result too large to print before computing it, and
the file tools read what they show (no more) in a thread, so the worker's
event loop, which also sends every activity's heartbeats, stays free.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import errno
import heapq
import json
import math
import operator
import os
import stat
import unicodedata
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field

from activities.redact import scrub_before_cutting
from activities.tools import ToolResult, tool

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
MAX_EXPRESSION_CHARS = 1000
# Deeper nesting (parentheses, chains of unary signs) is refused before parsing:
# the parser would spend a noticeable time on it and the evaluator recurses.
MAX_NESTING = 100
# Python prints integers of up to 4,300 digits; a result is refused above this.
MAX_RESULT_DIGITS = 4000
_MAX_BITS = math.ceil(MAX_RESULT_DIGITS * math.log2(10))


class CalculatorArgs(BaseModel):
    expression: str = Field(description="An arithmetic expression, e.g. (2 + 3) * 4 / 7")


@tool(description="Evaluate an arithmetic expression (+ - * / // % ** and parentheses).", label="Calculator")
async def calculator(args: CalculatorArgs) -> str:
    expression = args.expression.strip()
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"The expression is longer than {MAX_EXPRESSION_CHARS} characters; split it up.")
    if _nesting(expression) > MAX_NESTING:
        raise ValueError("The expression is nested too deeply; split it up.")
    try:
        tree = ast.parse(expression, mode="eval")
        value = _evaluate(tree.body)
    except SyntaxError as err:
        if "integer string conversion" in str(err):
            raise ValueError(
                f"A number in the expression has more than {MAX_RESULT_DIGITS} digits."
            ) from None
        raise ValueError(f"Not an arithmetic expression: {args.expression!r}") from None
    except (RecursionError, MemoryError):
        raise ValueError("The expression is nested too deeply; split it up.") from None
    except OverflowError:
        raise ValueError("The result is too large for a floating-point number.") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{expression} = {value}"


def _nesting(expression: str) -> int:
    """An upper bound on how deep the expression nests, in one linear pass."""
    deepest = depth = signs = 0
    for char in expression:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char in "+-":
            signs += 1
        elif not char.isspace():
            signs = 0
        deepest = max(deepest, depth + signs)
    return deepest


def _evaluate(node: ast.expr) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        _check_size(node.op, left, right)
        try:
            return _bounded(_OPERATORS[type(node.op)](left, right))  # type: ignore[operator]
        except ZeroDivisionError:
            raise ValueError("Division by zero.") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))  # type: ignore[operator]
    raise ValueError(f"Unsupported element in expression: {ast.unparse(node)!r}")


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse, before computing it, an integer result of more than
    ``MAX_RESULT_DIGITS`` digits: ``(10**1000)**10000`` would hold the
    event loop for seconds. The bit length of a power or a product is
    known from its operands' (at least ``(bits(a) - 1) * b`` for ``a ** b``,
    ``bits(a) + bits(b) - 1`` for ``a * b``)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # a float operand makes a float result: fixed size, OverflowError at worst
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        least_bits = (abs(left).bit_length() - 1) * right
    elif isinstance(op, ast.Mult) and left and right:
        least_bits = abs(left).bit_length() + abs(right).bit_length() - 1
    else:
        return
    if least_bits > _MAX_BITS:
        raise ValueError(f"The result would have more than {MAX_RESULT_DIGITS} digits.")


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise ValueError(f"The result would have more than {MAX_RESULT_DIGITS} digits.")
    return value


_workspace = Path.cwd().resolve()


def set_workspace(path: Path) -> None:
    """Confine ``read_file`` and ``list_files`` to ``path`` (the worker's setting)."""
    global _workspace
    _workspace = path.resolve()


def workspace_root() -> Path:
    return _workspace


def _inside_workspace(path: str) -> Path:
    """Resolve ``path`` against the workspace; refuse anything outside it
    (absolute paths, ``..``, symlinks that lead out) and anything hidden in
    it (``.env``, ``.git/config``: where secrets are kept, such as the
    worker's own in the default workspace, its working directory)."""
    root = workspace_root()
    asked = _shown(path)
    if "\0" in path:
        raise ValueError(f"The path {asked} has a NUL character in it.")
    try:
        resolved = _resolved(root / path)
    except RuntimeError:  # a loop of symbolic links
        raise ValueError(f"The path {asked} is a loop of symbolic links.") from None
    except OSError as err:
        raise ValueError(f"The path {asked} cannot be read: {err.strerror or err}.") from None
    if not _is_inside(resolved, root):
        raise _outside(asked)
    inside = resolved.relative_to(root)
    if _is_hidden(inside):
        named = any(part.startswith(".") and part not in (".", "..") for part in Path(path).parts)
        raise _hidden(asked, None if named else inside)  # not named: through a symlink
    return resolved


def _resolved(path: Path) -> Path:
    """``path.resolve()`` as Python 3.11 and 3.12 do it on every version:
    a loop of symbolic links raises ``RuntimeError``. Python 3.13 returns
    such a path unresolved instead, so the loop would only show later, as
    a file that cannot be opened."""
    resolved = path.resolve()
    try:
        resolved.stat()
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RuntimeError(f"Symlink loop from {str(path)!r}") from None
    return resolved


def _is_inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _is_hidden(inside: Path) -> bool:
    return any(part.startswith(".") for part in inside.parts)


def _hidden(asked: str, leads_to: Path | None) -> PermissionError:
    leads = f" leads to {_shown(str(leads_to))}, which" if leads_to is not None else ""
    return PermissionError(
        f"{asked}{leads} is hidden (a name starting with a dot): hidden files and directories "
        "(.env, .git, ...) often hold secrets and are not read."
    )


def _outside(asked: str) -> PermissionError:
    return PermissionError(f"{asked} is outside the workspace; only files inside it can be read.")


def _shown(path: str) -> str:
    """A path a model asked for, as quoted back: at most 200 characters."""
    return repr(path) if len(path) <= 200 else repr(path[:200]) + "..."


def _open_inside(path: Path, asked: str, *, directory: bool = False) -> int:
    """A descriptor of ``path`` (resolved inside the workspace), opened
    without blocking on a FIFO or following a last symbolic link, and
    checked again once open: a directory swapped for a symbolic link
    between the check and the open would lead outside."""
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    if directory:
        flags |= getattr(os, "O_DIRECTORY", 0)
    what = "directory" if directory else "file"
    try:
        fd = os.open(path, flags)
    except OSError:
        raise FileNotFoundError(f"No {what} {_shown(asked)} in the workspace.") from None
    try:
        status = os.fstat(fd)
        if not (stat.S_ISDIR(status.st_mode) if directory else stat.S_ISREG(status.st_mode)):
            raise FileNotFoundError(f"No {what} {_shown(asked)} in the workspace.")
        root = workspace_root()
        try:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # no /proc: the path must still name what was opened
            again = path.resolve()
            same = os.stat(again)
            opened = again if (same.st_dev, same.st_ino) == (status.st_dev, status.st_ino) else Path("/")
        if not _is_inside(opened, root):
            raise _outside(_shown(asked))
        if _is_hidden(opened.relative_to(root)):
            # A directory swapped for a link to a hidden one after the check
            # (a security audit: 3,830 reads of 20,000 in a race).
            raise _hidden(_shown(asked), opened.relative_to(root))
    except BaseException:
        os.close(fd)
        raise
    return fd


# What one call of read_file returns at most, and the longest line it shows whole.
MAX_READ_BYTES = 256 * 1024
MAX_LINE_CHARS = 2000
_MAX_LINE_BYTES = 4 * MAX_LINE_CHARS  # UTF-8: up to 4 bytes a character
_SKIP_CHUNK = 64 * 1024
# How far into a file one call reads at most (lines skipped to an offset, the
# rest of a cut line): 256 MiB take about a second; a 4 GiB line took 15.
MAX_SCAN_BYTES = 256 * 1024 * 1024
# list_files shows at most this many entries (directories first, then by
# name), looking at no more than MAX_SCAN_ENTRIES of a directory.
MAX_LIST_ENTRIES = 1000
MAX_SCAN_ENTRIES = 100_000


class ReadFileArgs(BaseModel):
    path: str = Field(description="Path relative to the workspace root")
    offset: int = Field(default=1, ge=1, description="First line to read (1-based)")
    limit: int = Field(default=400, ge=1, le=5000, description="Number of lines to read")


@tool(description="Read a text file from the workspace, with line numbers.", label="Read file")
async def read_file(args: ReadFileArgs) -> ToolResult:
    path = _inside_workspace(args.path)
    return await asyncio.to_thread(_read_file, path, args)


def _read_file(path: Path, args: ReadFileArgs) -> ToolResult:
    """Lines ``offset`` to ``offset + limit - 1``, read as a stream: the
    file is read up to the last line shown (and one more, to say whether
    more follow), never whole; a line longer than ``MAX_LINE_CHARS`` is
    cut, and the answer stops at ``MAX_READ_BYTES``."""
    fd = _open_inside(path, args.path)
    lines: list[str] = []
    size = 0
    note = ""
    with os.fdopen(fd, "rb") as file:
        number = args.offset
        try:
            for skipped in range(args.offset - 1):
                if skipped % 1024 == 0 and file.tell() > MAX_SCAN_BYTES:
                    raise _ScanLimit
                if _next_line(file) is None:
                    break
        except _ScanLimit:
            raise ValueError(
                f"Line {args.offset} is more than {MAX_SCAN_BYTES // 2**20} MiB into the file: "
                "read_file reads no further in one call."
            ) from None
        while len(lines) < args.limit:
            try:
                line = _next_line(file)
            except _ScanLimit as stopped:
                if stopped.line is not None:
                    lines.append(_numbered(number, stopped.line, cut=True))
                note = (
                    f"[Stopped in line {number}, {MAX_SCAN_BYTES // 2**20} MiB into the file: "
                    "read_file reads no further in one call]"
                )
                break
            if line is None:
                break
            shown = _numbered(number, *line)
            size += len(shown.encode()) + 1
            if size > MAX_READ_BYTES and lines:
                note = f"[Stopped at {MAX_READ_BYTES // 1024} KiB: read again with offset={number}]"
                break
            lines.append(shown)
            number += 1
        if not note and len(lines) == args.limit and _more_lines(file):
            note = f"[More lines follow: read again with offset={number}]"
        size_on_disk = os.fstat(file.fileno()).st_size
    body = "\n".join(lines) or (
        "(empty file)" if args.offset == 1 else f"(the file has fewer than {args.offset} lines)"
    )
    if note:
        body += "\n" + note
    details = {
        "path": str(path),
        "bytes": size_on_disk,
        "firstLine": args.offset,
        "linesShown": len(lines),
    }
    return ToolResult(content=body, details=details)


def _numbered(number: int, raw: bytes, cut: bool) -> str:
    """A line as shown: its number, its text, cut at ``MAX_LINE_CHARS``."""
    text = raw.decode("utf-8", errors="replace")
    if cut or len(text) > MAX_LINE_CHARS:
        text = scrub_before_cutting(text, MAX_LINE_CHARS)  # a secret across the cut showed its first part
        text += f" [line cut at {MAX_LINE_CHARS} characters]"
    return f"{number:>5}  {text}"


class _ScanLimit(Exception):
    """``MAX_SCAN_BYTES`` of the file read in one call; ``line``: the head
    of the line it stopped in."""

    def __init__(self, line: bytes | None = None) -> None:
        super().__init__()
        self.line = line


def _more_lines(file: IO[bytes]) -> bool:
    try:
        return _next_line(file) is not None
    except _ScanLimit:
        return True


def _next_line(file: IO[bytes]) -> tuple[bytes, bool] | None:
    """The next line without its line break (at most ``_MAX_LINE_BYTES`` of
    it) and whether it was cut; None at the end of the file. The rest of a
    long line is skipped in chunks, never held."""
    line = file.readline(_MAX_LINE_BYTES)
    if not line:
        return None
    if line.endswith(b"\n"):
        return line.rstrip(b"\r\n"), False
    cut = False
    while len(line) == _MAX_LINE_BYTES:  # the line goes on: skip the rest of it
        if file.tell() > MAX_SCAN_BYTES:
            raise _ScanLimit(line.rstrip(b"\r"))
        rest = file.readline(_SKIP_CHUNK)
        if not rest or rest == b"\n" or rest == b"\r\n":
            break
        cut = True
        if rest.endswith(b"\n"):
            break
        if len(rest) < _SKIP_CHUNK:
            break
    return line.rstrip(b"\r"), cut


class _Descriptor:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


class ListFilesArgs(BaseModel):
    path: str = Field(default=".", description="Directory relative to the workspace root")


@tool(description="List the files and directories in a workspace directory.", label="List files")
async def list_files(args: ListFilesArgs) -> str:
    path = _inside_workspace(args.path)
    return await asyncio.to_thread(_list_files, path, args.path)


EMPTY_LISTING = "(empty directory)"
_LINE_BREAKING = ("Cc", "Zl", "Zp")


def _shown_name(name: str) -> str:
    """A name as one line of the listing: quoted as a JSON string when it
    holds a control character, or starts as a quoted name or a note does
    (a file named ``new\nline.txt`` was listed as two files, a security
    audit)."""
    if (
        name.startswith(('"', "["))
        or name == EMPTY_LISTING
        # C0 and C1 controls, and the line and paragraph separators
        # (U+2028, U+2029): where str.splitlines() ends a line too (a review).
        or any(unicodedata.category(c) in _LINE_BREAKING for c in name)
    ):
        # JSON leaves C1 controls and the separators as they are: escaped here.
        quoted = json.dumps(name, ensure_ascii=False)
        return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in _LINE_BREAKING else c for c in quoted)
    return name


def _list_files(path: Path, asked: str) -> str:
    """Directories first, then files, by name; hidden entries left out; at
    most ``MAX_LIST_ENTRIES`` shown, with a line saying how many were not."""
    fd = _open_inside(path, asked, directory=True)
    entries: list[tuple[bool, str]] = []
    looked_at_all = True
    with contextlib.closing(_Descriptor(fd)), os.scandir(fd) as scan:
        for count, entry in enumerate(scan):
            if count >= MAX_SCAN_ENTRIES:
                looked_at_all = False
                break
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            entries.append((not is_dir, entry.name))
    shown = heapq.nsmallest(MAX_LIST_ENTRIES, entries)
    lines = [_shown_name(name) if is_file else f"{_shown_name(name)}/" for is_file, name in shown]
    left_out = len(entries) - len(shown)
    if not looked_at_all:
        lines.append(
            f"[The directory has more than {MAX_SCAN_ENTRIES:,} entries: these are the first "
            f"{len(shown):,} of the first {MAX_SCAN_ENTRIES:,} looked at. List a subdirectory instead.]"
        )
    elif left_out:
        lines.append(f"[{left_out:,} more entries not shown: list a subdirectory instead.]")
    return "\n".join(lines) or EMPTY_LISTING
