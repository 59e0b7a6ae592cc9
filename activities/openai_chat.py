"""Chat Completions wire format: our messages to OpenAI's, and OpenAI's
streamed chunks back to one ``AssistantMessage`` plus pi's
``assistantMessageEvent`` deltas."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from activities.model_http import WirePart
from workflows.arguments import MAX_NESTING, nesting_depth
from workflows.contract import ThinkingLevel
from workflows.inputs import clean_json, clean_text, image_base64, image_problem, image_type
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    Cost,
    ImageContent,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)

logger = logging.getLogger(__name__)

# USD per million tokens: (input, output, cached input). Unknown models cost 0.
MODEL_PRICES: dict[str, tuple[float, float, float]] = {
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "gpt-4o": (2.50, 10.00, 1.25),
    "gpt-4.1-nano": (0.10, 0.40, 0.025),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1": (2.00, 8.00, 0.50),
    "gpt-5-nano": (0.05, 0.40, 0.005),
    "gpt-5-mini": (0.25, 2.00, 0.025),
    "gpt-5": (1.25, 10.00, 0.125),
    "o4-mini": (1.10, 4.40, 0.275),
    "o3": (2.00, 8.00, 0.50),
}

# The chunk fields a reasoning delta may come in, as pi reads them; the one
# a thinking block came in is its ``thinkingSignature``.
REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_text")

MAX_TOOL_CALLS_PER_ANSWER = 5_000
"""The most tool calls one answer may ask for. The workflow's work on an
answer grows with its calls, and a workflow task that works on one answer
for more than 2 s fails the SDK's deadlock check on every attempt; 5,000
keep that work well under it (~0.3 s on the bench machine). An answer past
it ends the run with ``stopReason: "error"``, and none of its calls run."""

_FINISH_REASONS: dict[str, StopReason] = {
    "stop": "stop",
    "end": "stop",  # as pi maps it (some OpenAI-compatible servers send it)
    "length": "length",
    "tool_calls": "toolUse",
    "function_call": "toolUse",
}


def default_convert_to_llm(messages: list[AgentMessage]) -> list[AgentMessage]:
    """Keep what a model understands: user, assistant and tool results.
    Application messages (any other role) stay in the transcript only."""
    return [m for m in messages if m.role in ("user", "assistant", "toolResult")]


_T = TypeVar("_T")


class ConversionMemo:
    """What messages were converted to, kept while each message lives.

    A worker reads a conversation's stored context from its cache, the
    same message objects every model call; converting all of them again
    each call made a call's work grow with the conversation (~0.2 ms at 60
    messages, ~1.1 ms at 300 on the bench machine, three times the JSON
    body's cost). Keyed by identity, so it is used only where nothing
    changes a message in place: the context store's messages with the
    default context hooks. The converted parts are shared between
    requests: nothing changes them after conversion."""

    def __init__(self) -> None:
        self._parts: dict[int, tuple[weakref.ref[Any], Any]] = {}

    def get(self, message: Any, convert: Callable[[Any], _T]) -> _T:
        key = id(message)
        entry = self._parts.get(key)
        if entry is not None and entry[0]() is message:
            return entry[1]  # type: ignore[no-any-return]
        value = convert(message)
        parts = self._parts

        def forget(ref: weakref.ref[Any]) -> None:
            if parts.get(key, (None,))[0] is ref:
                del parts[key]

        parts[key] = (weakref.ref(message, forget), value)
        return value

    def __len__(self) -> int:
        return len(self._parts)


def _tool_parts(
    message: ToolResultMessage, part: type[dict[str, Any]] = dict
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A tool result as its ``tool`` message and the image parts that follow the batch."""
    text = "\n".join(c.text for c in message.content if isinstance(c, TextContent))
    returned = [c for c in message.content if isinstance(c, ImageContent)]
    if not text and returned:
        text = "(see attached image)"  # as pi sends it: the images follow the batch
    tool = part(role="tool", tool_call_id=wire_call_id(message.tool_call_id), content=text)
    images: list[dict[str, Any]] = []
    if returned:
        images.append({"type": "text", "text": f"Image(s) returned by tool {message.tool_name}:"})
        images.extend(_image_part(i) for i in returned)
    return tool, images


def _user_message(message: UserMessage, part: type[dict[str, Any]] = dict) -> dict[str, Any] | None:
    content = _user_content(message.content)
    # A server refuses an empty one (a transcript given at the start may hold it).
    return part(role="user", content=content) if content else None


def _assistant_parts(
    message: AssistantMessage, part: type[dict[str, Any]] = dict
) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
    """An assistant message as sent (None when it has neither text nor
    tool calls), and the calls it makes: each id with the id it is sent by."""
    call_ids = [call.id for call in message.tool_calls]
    wire_ids = _distinct_wire_ids(call_ids)
    return _assistant_message(message, wire_ids, part), tuple(zip(call_ids, wire_ids, strict=True))


def _distinct_wire_ids(call_ids: list[str]) -> list[str]:
    """Each call's id as sent, no two alike: a transcript given at the start
    may repeat an id in one message (the model's answers cannot: the stream
    renames a repeat), and a server pairs each call with one result by its
    id, so two calls ``d`` with one result were refused (400) on every later
    call of the conversation (a robustness audit). A repeat is sent as
    ``d_2`` (``d_3``, ...: the first such id not taken)."""
    wire_ids = [wire_call_id(call_id) for call_id in call_ids]
    if len(set(wire_ids)) == len(wire_ids):
        return wire_ids
    taken: set[str] = set(wire_ids)
    seen: set[str] = set()
    distinct = []
    for call_id, wire_id in zip(call_ids, wire_ids, strict=True):
        if wire_id in seen:
            number = 2
            while (wire_id := wire_call_id(f"{call_id}_{number}")) in taken:
                number += 1
            taken.add(wire_id)
        seen.add(wire_id)
        distinct.append(wire_id)
    return distinct


def _no_memo(message: Any, convert: Callable[[Any], _T]) -> _T:
    return convert(message)


_FRESH = (_tool_parts, _user_message, _assistant_parts)
_SHARED = (
    functools.partial(_tool_parts, part=WirePart),
    functools.partial(_user_message, part=WirePart),
    functools.partial(_assistant_parts, part=WirePart),
)


def to_openai_messages(
    system_prompt: str | None, messages: list[AgentMessage], memo: ConversionMemo | None = None
) -> list[dict[str, Any]]:
    """Our transcript as Chat Completions ``messages``.

    An assistant's ``tool_calls`` must be answered, each, by the ``tool``
    messages right after it, and a ``tool`` message must answer one: else
    the server refuses the request (400), and every later one with it in
    the context. So, as pi's conversion does:

    - failed or aborted assistant turns are left out (their partial output
      would mislead the model), and the results of their calls with them;
    - a call left without a result (a transcript given at the start) is
      answered "No result provided" when the next message comes;
    - tool-result images, which a ``tool`` message cannot carry, follow in
      ONE user message after the batch's last ``tool`` message.

    A result that answers no call the model is sent is left out, and so is
    a user message with no content. ``memo``: conversions kept from earlier
    calls (``ConversionMemo``).
    """
    converted = memo.get if memo is not None else _no_memo
    # Kept conversions are sent again each call: kept with their JSON too.
    # Fresh ones are encoded with the whole body (one call, ~3x less work).
    tool_parts, user_message, assistant_parts = _SHARED if memo is not None else _FRESH
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    # The open batch's calls without a result yet, in order, by the id each
    # is sent by; and by call id, those ids (more than one where a
    # transcript given at the start repeats an id: answered in order).
    unanswered: dict[str, None] = {}
    waiting: dict[str, list[str]] = {}
    images: list[dict[str, Any]] = []  # the open batch's result images

    def close_batch() -> None:
        for wire_id in unanswered:
            out.append({"role": "tool", "tool_call_id": wire_id, "content": "No result provided"})
        unanswered.clear()
        waiting.clear()
        if images:
            out.append({"role": "user", "content": list(images)})
            images.clear()

    for message in messages:
        if isinstance(message, ToolResultMessage):
            wire_ids = waiting.get(message.tool_call_id)
            if not wire_ids:
                logger.warning("Left out a tool result that answers no call sent: %s", message.tool_call_id)
                continue
            wire_id = wire_ids.pop(0)
            del unanswered[wire_id]
            tool, returned = converted(message, tool_parts)
            if tool["tool_call_id"] != wire_id:  # a repeated id's later call: a copy (parts are shared)
                tool = {**tool, "tool_call_id": wire_id}
            out.append(tool)
            images.extend(returned)
            continue
        close_batch()
        if isinstance(message, UserMessage):
            user = converted(message, user_message)
            if user is not None:
                out.append(user)
        elif isinstance(message, AssistantMessage) and message.stop_reason not in ("error", "aborted"):
            sent, calls = converted(message, assistant_parts)
            if sent is not None:
                out.append(sent)
            for call_id, wire_id in calls:
                unanswered[wire_id] = None
                waiting.setdefault(call_id, []).append(wire_id)
    close_batch()
    return out


# What OpenAI takes: a tool call id of at most 40 characters, a function
# name of letters, digits, `_` and `-` (at most 64).
MAX_CALL_ID = 40
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_IN_TOOL_NAME = re.compile(r"[^a-zA-Z0-9_-]")


def wire_call_id(call_id: str) -> str:
    """A tool call id as sent to the model: as it is when OpenAI takes it,
    else cut with a digest of the whole (ids from other providers, such as
    pi's Responses ids ``call_...|fc_...``, or vLLM's 46-character ones)."""
    if len(call_id) <= MAX_CALL_ID:
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "replace")).hexdigest()[:10]
    return f"{call_id[: MAX_CALL_ID - 11]}_{digest}"


def _wire_tool_name(name: str) -> str:
    """A called tool's name as sent back: one the model made up
    (``multi_tool_use.parallel``, an empty one) made one OpenAI takes; its
    result already says the tool was not found."""
    cleaned = _NOT_IN_TOOL_NAME.sub("_", name)[:64]
    return cleaned or "unknown_tool"


def _user_content(content: str | list[TextContent | ImageContent]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": c.text} if isinstance(c, TextContent) else _image_part(c) for c in content
    ]


def _image_part(image: ImageContent) -> dict[str, Any]:
    """The image as a data URL; one a model would refuse (a signal, a start
    input or a tool can carry one) as a note saying why, so that the call,
    and every later call with it in the context, is not refused for it."""
    problem = image_problem(image)
    if problem is not None:
        logger.warning("Sent a note instead of an image the model would refuse: %s", problem)
        return {"type": "text", "text": f"[An image was left out: {problem}.]"}
    return {
        "type": "image_url",
        "image_url": {"url": f"data:{image_type(image)};base64,{image_base64(image)}"},
    }


def _assistant_message(
    message: AssistantMessage, wire_ids: list[str], part: type[dict[str, Any]] = dict
) -> dict[str, Any] | None:
    """As pi sends one: its text without blank parts (None when there is
    none), its reasoning, its calls; None when it has no text and no
    calls (a thinking-only or blank answer), which servers refuse."""
    text = "".join(c.text for c in message.content if isinstance(c, TextContent) and c.text.strip())
    if not text and not message.tool_calls:
        return None
    result = part(role="assistant", content=text or None)
    thinking = [c for c in message.content if isinstance(c, ThinkingContent) and c.thinking.strip()]
    if thinking and thinking[0].thinking_signature in REASONING_FIELDS:
        # As pi does: the reasoning goes back in the field it streamed in
        # (its ``thinkingSignature``), which llama.cpp's gpt-oss and the
        # reasoning models that call tools expect on the next request. Only
        # a reasoning field: a transcript given at start cannot set others.
        result[thinking[0].thinking_signature] = "\n".join(c.thinking for c in thinking)
    if message.tool_calls:
        result["tool_calls"] = [
            {
                "id": wire_id,
                "type": "function",
                "function": {"name": _wire_tool_name(call.name), "arguments": json.dumps(call.arguments)},
            }
            for call, wire_id in zip(message.tool_calls, wire_ids, strict=True)
        ]
    return result


def reasoning_effort(level: ThinkingLevel) -> str | None:
    """The ``reasoning_effort`` sent for a thinking level (None: not sent)."""
    return None if level == "off" else level


def completion_as_chunk(completion: dict[str, Any]) -> dict[str, Any]:
    """A whole (not streamed) chat completion as the one chunk that would
    say the same: each choice's message as its delta, its tool calls
    numbered."""
    choices = []
    for choice in completion.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        delta = dict(message) if isinstance(message, dict) else {}
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [
                {**call, "index": call.get("index", n)} if isinstance(call, dict) else call
                for n, call in enumerate(calls)
            ]
        choices.append(
            {"index": choice.get("index", 0), "delta": delta, "finish_reason": choice.get("finish_reason")}
        )
    return {"object": "chat.completion.chunk", "choices": choices, "usage": completion.get("usage")}


def _text_of(value: Any) -> str:
    """A streamed field as text: a string as it is (lone surrogates
    replaced), the texts of a list of parts joined, a number as its digits,
    nothing as ``""``."""
    if value is None:
        return ""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return "".join(text for _, text in _content_parts(value))
    if isinstance(value, dict):
        return _text_of(value.get("text"))
    return clean_text(str(value))


def _content_parts(parts: list[Any]) -> list[tuple[str, str]]:
    """``("text" | "thinking", text)`` for each part of a content list that
    has text (Mistral streams ``{"type": "thinking", "thinking": [...]}``
    parts beside its text ones)."""
    found: list[tuple[str, str]] = []
    for part in parts:
        if isinstance(part, str):
            kind, text = "text", clean_text(part)
        elif isinstance(part, dict) and part.get("type") == "thinking":
            kind, text = "thinking", _text_of(part.get("thinking"))
        elif isinstance(part, dict):
            kind, text = "text", _text_of(part.get("text"))
        else:
            continue
        if text:
            found.append((kind, text))
    return found


class StreamEndedEarly(Exception):
    """The stream closed before the model said why it stopped."""


class StreamAssembler:
    """Turns streamed chunks into pi's ``assistantMessageEvent`` deltas and,
    at the end, one ``AssistantMessage``.

    Blocks (thinking, text, tool calls) are kept in the order they start; a
    new block closes the previous one (``*_end``) at once, so a subscriber
    sees each block end before the next starts (pi's openai-completions
    stream keeps one text and one thinking block a message, and ends them
    all when the stream ends). A
    provider that interleaves the deltas of parallel tool calls still gets
    every call whole: a delta for a closed call reopens it, and it is
    closed again, with its whole arguments, when the next block starts or
    at the end.
    """

    def __init__(self, model: str, provider: str = "openai") -> None:
        self._model = model
        self._provider = provider
        self._blocks: list[TextContent | ThinkingContent | ToolCall] = []
        self._raw_args: dict[int, str] = {}  # block index -> streamed JSON
        self._tool_blocks: dict[Any, int] = {}  # OpenAI tool index -> block index
        self._sent_ids: dict[int, str] = {}  # tool block -> the id the server gave it
        self._sent_id_blocks: dict[str, int] = {}  # and back (the latest block with it)
        self._call_ids: set[str] = set()
        self._open: int | None = None  # open text/thinking block
        self._open_tool: int | None = None  # tool call receiving deltas
        self._closed_args: dict[int, str] = {}  # tool block -> its arguments when it was closed
        self._arg_errors: dict[str, str] = {}  # tool call id -> why its arguments are not usable
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self.started = False
        self.done = False
        """The server said the answer is whole (``[DONE]``, or a completion
        sent whole): one without a finish reason stopped, as pi maps a
        missing reason (``[DONE]`` before any chunk is still no answer)."""
        self.too_many_calls = False
        """The answer asked for more than ``MAX_TOOL_CALLS_PER_ANSWER`` tool
        calls: the rest of the stream need not be read."""
        self.timestamp = int(time.time() * 1000)
        """When the request was made: the streamed message's time from its
        ``message_start`` on, as pi stamps it."""

    @property
    def finished(self) -> bool:
        """The server has said why the answer stopped (its finish reason)."""
        return self._finish_reason is not None

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Consume one streamed chunk (its JSON, as ``ChatPoster.stream`` yields
        it); return the events it makes.

        Servers differ in what they put where, and an answer one of them
        sends the same way every time must not fail every attempt: content
        may come as a list of parts (Mistral's ``[{"type": "text", ...},
        {"type": "thinking", ...}]``), arguments as a JSON object
        (llama.cpp), an id as a number; a tool call delta may come without
        ``index`` (its id, else the call it continues, tells which)."""
        if not isinstance(chunk, dict):
            return []  # `data: null` and the like: nothing a chunk could say
        self.started = True
        if isinstance(chunk.get("usage"), dict) and chunk["usage"]:
            self._usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            if not chunk.get("usage") and isinstance(choice.get("usage"), dict) and choice["usage"]:
                self._usage = choice["usage"]  # Moonshot sends it there (as pi reads it)
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                delta = {}
            field = next((f for f in REASONING_FIELDS if delta.get(f)), None)
            if field is not None:
                thinking = _text_of(delta[field])
                if thinking:
                    events += self._append_text(ThinkingContent, "thinking", thinking, field)
            content = delta.get("content")
            if isinstance(content, list):
                for kind, text in _content_parts(content):
                    if kind == "thinking":
                        events += self._append_text(ThinkingContent, "thinking", text)  # not sent back
                    else:
                        events += self._append_text(TextContent, "text", text)
            elif content:
                events += self._append_text(TextContent, "text", _text_of(content))
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    events += self._append_tool_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = _text_of(choice["finish_reason"])
        return events

    def _append_text(
        self,
        kind: type[TextContent] | type[ThinkingContent],
        name: str,
        delta: str,
        signature: str | None = None,
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or not isinstance(self._blocks[self._open], kind):
            events += self._close_open() + self._close_tool()
            self._blocks.append(
                TextContent(text="")
                if kind is TextContent
                else ThinkingContent(thinking="", thinking_signature=signature)
            )
            self._open = len(self._blocks) - 1
            events.append({"type": f"{name}_start", "contentIndex": self._open})
        block = self._blocks[self._open]
        if isinstance(block, TextContent):
            block.text += delta
        elif isinstance(block, ThinkingContent):
            block.thinking += delta
        events.append({"type": f"{name}_delta", "contentIndex": self._open, "delta": delta})
        return events

    def _append_tool_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        started = len(self._raw_args)  # tool calls started
        sent_id = _text_of(call.get("id"))
        name = _text_of(function.get("name"))
        index = call.get("index")
        arguments = function.get("arguments")
        block_index = self._block_of(
            index if isinstance(index, int) else None, sent_id, name, bool(arguments)
        )
        if block_index is None and started >= MAX_TOOL_CALLS_PER_ANSWER:
            self.too_many_calls = True
            return events
        if block_index is None:
            events += self._close_open() + self._close_tool()
            call_id = self._unique_id(sent_id or f"call_{started}")
            self._blocks.append(ToolCall(id=call_id, name=name))
            block_index = len(self._blocks) - 1
            self._tool_blocks[index if isinstance(index, int) else ("no index", block_index)] = block_index
            self._raw_args[block_index] = ""
            events.append(
                {"type": "toolcall_start", "contentIndex": block_index, "id": call_id, "toolName": name}
            )
        elif block_index != self._open_tool:
            events += self._close_tool()  # an interleaved delta: that call is open again
        block = self._blocks[block_index]
        if name and isinstance(block, ToolCall) and not block.name:
            block.name = name  # a name sent after the call's id (pi takes it from any delta)
        if sent_id and block_index not in self._sent_ids:
            self._sent_ids[block_index] = sent_id  # its id, sent now or on a later delta
            self._sent_id_blocks[sent_id] = block_index  # its latest call
        self._open_tool = block_index
        pieces = (
            clean_text(json.dumps(arguments, ensure_ascii=False))
            if isinstance(arguments, dict | list)
            else _text_of(arguments)
        )
        if pieces:
            self._raw_args[block_index] += pieces
            events.append({"type": "toolcall_delta", "contentIndex": block_index, "delta": pieces})
        return events

    def _block_of(self, index: int | None, sent_id: str, name: str, has_arguments: bool) -> int | None:
        """The tool call block a delta continues (None: it starts a call).

        By ``index``, unless the delta names another call there: another id
        (some Ollama versions number every call 0), or, without an id,
        another function. Without ``index``: the call with its id, or,
        without an id, the last call (a piece of its arguments, its name
        sent late or again: ``_continues``)."""
        if index is None:
            if sent_id:
                known = self._sent_id_blocks.get(sent_id)
                if known is not None and self._names_another_function(known, name):
                    return None  # a server that gives every call one id
                return known
            if not self._raw_args:
                return None
            last = self._open_tool if self._open_tool is not None else max(self._raw_args)
            return last if not name or self._continues(last, name, has_arguments) else None
        block_index = self._tool_blocks.get(index)
        if block_index is None:
            return None
        known_id = self._sent_ids.get(block_index)
        if sent_id and known_id is not None and sent_id != known_id:
            return None
        if not sent_id and self._names_another_function(block_index, name):
            return None
        return block_index

    def _continues(self, block_index: int, name: str, has_arguments: bool) -> bool:
        """Whether a delta naming ``name``, without index or id, continues
        call ``block_index``: a call with no name yet takes it; one with
        this name continues while its arguments are not whole JSON, or when
        the delta brings none (a server repeating the name on every delta).
        Otherwise it starts a call: whole calls sent one per delta, some to
        the same function."""
        block = self._blocks[block_index]
        if not isinstance(block, ToolCall):
            return False
        if not block.name:
            return True
        if block.name != name:
            return False
        if not has_arguments:
            return True
        try:
            return not isinstance(json.loads(self._raw_args[block_index]), dict)
        except ValueError:
            return True

    def _names_another_function(self, block_index: int, name: str) -> bool:
        block = self._blocks[block_index]
        return bool(name) and isinstance(block, ToolCall) and bool(block.name) and name != block.name

    def _unique_id(self, call_id: str) -> str:
        """``call_id``, or, when a call of this answer has it already, the
        first free ``call_id_N``: each call gets its own result (and its own
        abort, approval and argument check), which pair up by id."""
        n = 2
        unique = call_id
        while unique in self._call_ids:
            unique, n = f"{call_id}_{n}", n + 1
        self._call_ids.add(unique)
        return unique

    def _close_tool(self) -> list[dict[str, Any]]:
        """``toolcall_end`` for the tool call receiving deltas, if any."""
        if self._open_tool is None:
            return []
        index, self._open_tool = self._open_tool, None
        return [self._end_tool_call(index)]

    def _end_tool_call(self, index: int) -> dict[str, Any]:
        """The ``toolcall_end`` of block ``index``, its arguments parsed now."""
        block = self._blocks[index]
        assert isinstance(block, ToolCall)
        raw = self._raw_args[index]
        self._closed_args[index] = raw
        self._arg_errors.pop(block.id, None)
        try:
            parsed = _parse_arguments(raw) if raw.strip() else {}
            if not isinstance(parsed, dict):
                raise ValueError(f"expected a JSON object, got {type(parsed).__name__}")
            if nesting_depth(parsed) > MAX_NESTING:
                raise ValueError(f"nested deeper than {MAX_NESTING} levels")
            block.arguments = clean_json(parsed)  # "\ud83d" escaped in the JSON: half an emoji
        except (ValueError, RecursionError) as err:
            block.arguments = {}
            self._arg_errors[block.id] = f"{err or type(err).__name__} (received: {raw[:500]})"
        return {"type": "toolcall_end", "contentIndex": index, "toolCall": block.model_dump()}

    def _close_open(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        block, index, self._open = self._blocks[self._open], self._open, None
        if isinstance(block, TextContent):
            return [{"type": "text_end", "contentIndex": index, "content": block.text}]
        assert isinstance(block, ThinkingContent)
        return [{"type": "thinking_end", "contentIndex": index, "content": block.thinking}]

    def finish(
        self, *, aborted: bool = False
    ) -> tuple[AssistantMessage, dict[str, str], list[dict[str, Any]]]:
        """Close the stream: the final message, the tool calls whose
        arguments were not valid JSON (id -> error), and the closing events.

        An aborted message keeps its text but drops tool calls, which may be
        incomplete and would otherwise be left without results; so does one
        that asked for too many calls (it ends as an error)."""
        too_many = self.too_many_calls and not aborted
        # A finish reason that is no answer (content_filter, network_error,
        # one unknown) ends it as an error, as pi's does: its calls do not run.
        refused = not aborted and self._finish_reason not in (None, *_FINISH_REASONS)
        dropped = aborted or too_many or refused
        if not dropped and self._finish_reason is None and not (self.done and self.started):
            raise StreamEndedEarly(
                "The model's stream ended before it finished its answer."
                if self.started
                else "The model server's stream ended without a single chunk."
            )
        events = self._close_open() + self._close_tool()
        if not dropped:
            events += [
                self._end_tool_call(index)  # never closed, or reopened by an interleaved delta
                for index in sorted(self._raw_args)
                if self._closed_args.get(index) != self._raw_args[index]
            ]
        events = [e for e in events if not (dropped and e["type"] == "toolcall_end")]
        errors = {} if dropped else dict(self._arg_errors)
        content = [b for b in self._blocks if not (dropped and isinstance(b, ToolCall))]
        if aborted:
            stop_reason: StopReason = "aborted"
        elif too_many:
            stop_reason = "error"
        elif self._finish_reason == "length":
            stop_reason = "length"  # tool calls cut off mid-way must not run
        elif any(isinstance(b, ToolCall) for b in content):
            stop_reason = "toolUse"
        elif self._finish_reason in (None, "tool_calls", "function_call"):
            # No reason but the answer whole ([DONE]), or calls announced
            # and none sent (vLLM when its tool parser fails): pi says stop.
            stop_reason = "stop"
        else:
            stop_reason = _FINISH_REASONS.get(self._finish_reason, "error")
        message = AssistantMessage(
            content=content,
            provider=self._provider,
            model=self._model,
            usage=usage_from_openai(self._model, self._usage),
            stop_reason=stop_reason,
            error_message=(
                "Request was aborted"
                if aborted
                else f"The model asked for more than {MAX_TOOL_CALLS_PER_ANSWER:,} tool calls in one "
                "answer, so none of them ran."
                if too_many
                else None
                if stop_reason != "error"
                else f"The model stopped with finish_reason={self._finish_reason!r}."
            ),
            timestamp=self.timestamp,
        )
        return message, errors, events


_VALID_ESCAPES = frozenset('"\\/bfnrt')  # and `u` with four hex digits (``repair_json``)
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


def _parse_arguments(raw: str) -> Any:
    """A tool call's arguments: the JSON, or, when that fails, the JSON as
    pi repairs it (``repair_json``), which models' Windows paths, regexes
    and multi-line strings often need. Arguments cut off mid-way are not
    completed (pi's partial parse): a call with half its arguments must
    not run, so they stay an error the model sees."""
    try:
        return json.loads(raw)
    except ValueError:
        repaired = repair_json(raw)
        if repaired == raw:
            raise
        return json.loads(repaired)


def repair_json(text: str) -> str:
    """pi's ``repairJson``: inside string literals, raw control characters
    escaped and a backslash before a character JSON does not escape doubled
    (a Windows path or a regular expression written with single
    backslashes, a line break typed into a string). Unlike pi's, a ``u``
    not followed by four hex digits counts as such a character (pi keeps
    the escape, and the arguments then fail to parse), so ``C:\\users``
    is read as written."""
    out: list[str] = []
    in_string = False
    index = 0
    while index < len(text):
        char = text[index]
        index += 1
        if not in_string:
            out.append(char)
            in_string = char == '"'
        elif char == '"':
            out.append(char)
            in_string = False
        elif char == "\\":
            following = text[index] if index < len(text) else ""
            if following == "u" and _HEX4.fullmatch(text, index + 1, index + 5):
                out.append(text[index - 1 : index + 5])
                index += 5
            elif following in _VALID_ESCAPES:
                out.append(char + following)
                index += 1
            else:
                out.append("\\\\")
        elif ord(char) < 0x20:
            out.append(_CONTROL_ESCAPES.get(char) or f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


_CONTROL_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def usage_from_openai(model: str, usage: dict[str, Any] | None) -> Usage:
    """pi's usage (with cost) from an OpenAI ``usage`` object."""
    if not isinstance(usage, dict) or not usage:
        return Usage()
    prompt = _tokens(usage.get("prompt_tokens"))
    output = _tokens(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    reported = details.get("cached_tokens")
    if reported is None:
        reported = usage.get("prompt_cache_hit_tokens")  # DeepSeek
    written = min(prompt, _tokens(details.get("cache_write_tokens")))
    # As pi reads them: some servers (OpenRouter) count this request's
    # writes among the cached tokens too; those are writes, not reads.
    cached = min(prompt - written, max(0, _tokens(reported) - written))
    price_in, price_out, price_cached = _price(model)
    cost = Cost(
        input=(prompt - cached - written) * price_in / 1e6,
        output=output * price_out / 1e6,
        cache_read=cached * price_cached / 1e6,
        cache_write=written * price_in / 1e6,  # no price of its own here: as input
    )
    cost.total = cost.input + cost.output + cost.cache_read + cost.cache_write
    return Usage(
        input=prompt - cached - written,
        output=output,
        cache_read=cached,
        cache_write=written,
        total_tokens=prompt + output,  # as pi counts it, not the server's own total
        cost=cost,
    )


# The most tokens one answer is taken to report (JavaScript's largest exact integer).
MAX_TOKENS = 2**53 - 1


def _tokens(value: Any) -> int:
    """A token count as the server reported it, if it is one: a whole
    number from 0 to MAX_TOKENS (anything else, e.g. a string, a negative or
    a fraction, counts as 0; a larger one as MAX_TOKENS)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return min(value, MAX_TOKENS)


def _price(model: str) -> tuple[float, float, float]:
    name = model.rsplit("/", 1)[-1]
    for prefix in sorted(MODEL_PRICES, key=len, reverse=True):
        if name.startswith(prefix):
            return MODEL_PRICES[prefix]
    return (0.0, 0.0, 0.0)
