"""The scenario every row runs, and the one tool the peers and the floor share.

Scripted model at zero latency: K rounds in which the model asks for two
parallel ``calculator`` calls, then a final answer of a few tokens. Every
row sees the same steps (one queue per model name on the scripted server).
"""

from __future__ import annotations

import ast
import operator
from typing import Any

PROMPT = "run the scenario"
ANSWER = "All rounds computed."  # a few tokens
TOOL_NAME = "calculator"
TOOL_DESCRIPTION = "Evaluate an arithmetic expression (+ - * /)."

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def steps(rounds: int, latency_ms: int = 0) -> list[dict[str, Any]]:
    """The scripted model's answers: ``rounds`` pairs of tool calls, then the
    answer; each begins ``latency_ms`` after its request (a model's latency)."""
    script: list[dict[str, Any]] = [
        {
            "tool_calls": [
                {"id": f"r{i}a", "name": TOOL_NAME, "arguments": {"expression": f"{i}*7"}},
                {"id": f"r{i}b", "name": TOOL_NAME, "arguments": {"expression": f"{i}+7"}},
            ]
        }
        for i in range(rounds)
    ]
    script.append({"text": ANSWER, "chunk_chars": 4})
    if latency_ms:
        for step in script:
            step["first_delay_ms"] = latency_ms
    return script


def calculate(expression: str) -> str:
    """The tool body: ``"3*7 = 21"``, as the project's calculator answers."""
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{expression.strip()} = {value}"


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))  # type: ignore[operator]
    raise ValueError(f"Unsupported expression: {ast.unparse(node)!r}")
