"""Example tools that ship with the worker: a calculator, and a file reader
and lister confined to a workspace directory (``AGENT_WORKSPACE``, default:
the worker's working directory; the worker sets it with ``set_workspace``)."""

from __future__ import annotations

import ast
import operator
from pathlib import Path

from pydantic import BaseModel, Field

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
MAX_EXPONENT = 10_000


class CalculatorArgs(BaseModel):
    expression: str = Field(description="An arithmetic expression, e.g. (2 + 3) * 4 / 7")


@tool(description="Evaluate an arithmetic expression (+ - * / // % ** and parentheses).", label="Calculator")
async def calculator(args: CalculatorArgs) -> str:
    try:
        tree = ast.parse(args.expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"Not an arithmetic expression: {args.expression!r}") from None
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{args.expression.strip()} = {value}"


def _evaluate(node: ast.expr) -> int | float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"Exponent {right} is too large (at most {MAX_EXPONENT}).")
        try:
            return _OPERATORS[type(node.op)](left, right)  # type: ignore[operator]
        except ZeroDivisionError:
            raise ValueError("Division by zero.") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))  # type: ignore[operator]
    raise ValueError(f"Unsupported element in expression: {ast.unparse(node)!r}")


_workspace = Path.cwd().resolve()


def set_workspace(path: Path) -> None:
    """Confine ``read_file`` and ``list_files`` to ``path`` (the worker's setting)."""
    global _workspace
    _workspace = path.resolve()


def workspace_root() -> Path:
    return _workspace


def _inside_workspace(path: str) -> Path:
    """Resolve ``path`` against the workspace; refuse anything outside it
    (absolute paths, ``..``, symlinks that lead out)."""
    root = workspace_root()
    resolved = (root / path).resolve()
    if resolved != root and root not in resolved.parents:
        raise PermissionError(f"{path!r} is outside the workspace {root}; only files inside it can be read.")
    return resolved


class ReadFileArgs(BaseModel):
    path: str = Field(description="Path relative to the workspace root")
    offset: int = Field(default=1, ge=1, description="First line to read (1-based)")
    limit: int = Field(default=400, ge=1, le=5000, description="Number of lines to read")


@tool(description="Read a text file from the workspace, with line numbers.", label="Read file")
async def read_file(args: ReadFileArgs) -> ToolResult:
    path = _inside_workspace(args.path)
    if not path.is_file():
        raise FileNotFoundError(f"No file {args.path!r} in the workspace.")
    lines = path.read_text(errors="replace").splitlines()
    chosen = lines[args.offset - 1 : args.offset - 1 + args.limit]
    body = "\n".join(f"{args.offset + i:>5}  {line}" for i, line in enumerate(chosen))
    remaining = len(lines) - (args.offset - 1 + len(chosen))
    if remaining > 0:
        body += f"\n[{remaining} more lines: read again with offset={args.offset + len(chosen)}]"
    return ToolResult(content=body or "(empty file)", details={"path": str(path), "lines": len(lines)})


class ListFilesArgs(BaseModel):
    path: str = Field(default=".", description="Directory relative to the workspace root")


@tool(description="List the files and directories in a workspace directory.", label="List files")
async def list_files(args: ListFilesArgs) -> str:
    path = _inside_workspace(args.path)
    if not path.is_dir():
        raise NotADirectoryError(f"No directory {args.path!r} in the workspace.")
    entries = sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name))
    shown = [f"{p.name}/" if p.is_dir() else p.name for p in entries if not p.name.startswith(".")]
    return "\n".join(shown) or "(empty directory)"
