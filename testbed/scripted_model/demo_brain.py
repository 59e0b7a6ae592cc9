"""Deterministic rule-based responder used when a model has no scripted steps.

It lets the offline demo (and a person typing into the chat) get sensible
answers without an API key: arithmetic goes to `calculator`, file paths go to
`read_file`, tool results are summarised, and anything else gets a friendly
reply quoting the user. The same request always yields the same response.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .script import ScriptStep, ScriptToolCall

_EXPRESSION = re.compile(r"[\d(.][\d\s+\-*/().]*[\d)]")
_HAS_OPERATOR = re.compile(r"[\d)]\s*(?:\*\*|[+\-*/])\s*[\d(.]")
_FILE_SUFFIXES = (".py", ".md", ".txt", ".toml")
_WORD_PUNCTUATION = "\"'`()[]{}<>,;:!?"
_MAX_QUOTE = 200


def respond(request: dict[str, Any]) -> ScriptStep:
    """Pick the demo answer for an OpenAI chat completions request body."""
    messages: list[dict[str, Any]] = request.get("messages") or []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return ScriptStep(text=_summarise_tool_results(messages))
    user_text = _message_text(last) if last.get("role") == "user" else ""
    tools = _offered_tools(request)
    calls = _tool_calls_for(user_text, tools)
    if calls:
        return ScriptStep(tool_calls=_with_ids(calls, messages))
    return ScriptStep(text=_friendly_reply(user_text))


def find_expressions(text: str) -> list[str]:
    """Arithmetic expressions in `text`: digits, operators and parentheses with at least one operator."""
    found = (match.group().strip() for match in _EXPRESSION.finditer(text))
    return [expr for expr in found if _HAS_OPERATOR.search(expr)]


def find_paths(text: str) -> list[str]:
    """Path-like words in `text`: containing `/` or ending in a known file suffix."""
    words = (word.strip(_WORD_PUNCTUATION).rstrip(".") for word in text.split())
    paths = [w for w in words if _looks_like_path(w)]
    return list(dict.fromkeys(paths))


def _looks_like_path(word: str) -> bool:
    """A word with a letter that contains `/` or ends in a known suffix."""
    has_letter = any(ch.isalpha() for ch in word)
    return has_letter and ("/" in word or word.endswith(_FILE_SUFFIXES))


def _tool_calls_for(user_text: str, tools: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """The (name, arguments) calls the rules ask for, or none."""
    if "calculator" in tools:
        expressions = find_expressions(user_text)
        if expressions:
            return [("calculator", {"expression": expr}) for expr in expressions]
    if "read_file" in tools:
        return [("read_file", {"path": path}) for path in find_paths(user_text)]
    return []


def _with_ids(
    calls: list[tuple[str, dict[str, Any]]], messages: list[dict[str, Any]]
) -> list[ScriptToolCall]:
    """Attach ids derived from the conversation so identical requests get identical ids."""
    digest = hashlib.sha1(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return [
        ScriptToolCall(id=f"call_{digest}_{i}", name=name, arguments=arguments)
        for i, (name, arguments) in enumerate(calls)
    ]


def _offered_tools(request: dict[str, Any]) -> set[str]:
    """Names of the function tools in the request."""
    names = set()
    for tool in request.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def _message_text(message: dict[str, Any]) -> str:
    """The text of a message whose content is a string or a list of content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (part.get("text", "") for part in content if isinstance(part, dict))
        return "".join(p for p in parts if isinstance(p, str))
    return ""


def _summarise_tool_results(messages: list[dict[str, Any]]) -> str:
    """One clause per trailing tool result: `<tool> returned <first line>`."""
    names = _tool_names_by_call_id(messages)
    results: list[dict[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.insert(0, message)
    clauses = [
        f"{names.get(str(m.get('tool_call_id')), 'the tool')} returned {_first_line(_message_text(m))}"
        for m in results
    ]
    return "; ".join(clauses) + "."


def _tool_names_by_call_id(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Map tool call ids to function names from the assistant messages."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            names[str(call.get("id"))] = str(function.get("name", "the tool"))
    return names


def _first_line(text: str) -> str:
    """First non-empty line, truncated to keep the answer short."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "(nothing)")
    return _truncate(line)


def _truncate(text: str) -> str:
    """Cut `text` to `_MAX_QUOTE` characters, marking the cut with an ellipsis."""
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 1] + "…"


def _friendly_reply(user_text: str) -> str:
    """The fallback answer that quotes the user and points at the real model."""
    hint = "Set OPENAI_API_KEY to talk to a real model."
    said = " ".join(user_text.split())
    if not said:
        return f"Hello! I'm the offline scripted model. {hint}"
    return f'I\'m the offline scripted model. You said: "{_truncate(said)}". {hint}'
