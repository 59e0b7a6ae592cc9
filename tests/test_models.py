"""The wire models' JSON contract and the message queues, without a server
(SPEC 1, 2, 3 and README "The contract"): the exact shapes pi-agent-core
0.73.1 gives its messages and events, which fields are left out and which
are written as null, snake_case taken on input, round trips, usage totals
and the queue modes. Found by a mutation audit of ``workflows/models.py``
and ``workflows/queues.py``: behaviours no unit test pinned."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_core import to_json

from tests.support.fake_loop import user
from workflows.contract import AgentSettings, SessionCarry, SessionInput, SettingsInForce
from workflows.models import (
    EVENTS_TOPIC,
    AgentMessage,
    AssistantMessage,
    Cost,
    CustomMessage,
    EventAdapter,
    ImageContent,
    MessageAdapter,
    MessageList,
    MessageRetryEvent,
    MessageStartEvent,
    RunState,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolDeclaration,
    ToolExecutionEndEvent,
    ToolOutcome,
    ToolResultMessage,
    TurnEndEvent,
    Usage,
    UserMessage,
    text_result,
)
from workflows.queues import MessageQueue


def texts(messages: list[Any]) -> list[Any]:
    """The contents of queued user messages."""
    return [m.content for m in messages]


def wire(value: Any) -> Any:
    """The JSON a model becomes on the wire (pydantic's JSON, as the payload converter writes it)."""
    return json.loads(to_json(value))


ZERO_USAGE = {
    "input": 0,
    "output": 0,
    "cacheRead": 0,
    "cacheWrite": 0,
    "totalTokens": 0,
    "cost": {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0, "total": 0.0},
}


# --- messages: the exact JSON ------------------------------------------------


def test_a_default_assistant_message_has_every_key_pi_requires_and_no_error_message() -> None:
    """SPEC 1: api, provider, model, usage (zeros), stopReason, timestamp; errorMessage? left out."""
    assert wire(AssistantMessage()) == {
        "role": "assistant",
        "content": [],
        "api": "openai-completions",
        "provider": "openai",
        "model": "",
        "usage": ZERO_USAGE,
        "stopReason": "stop",
        "timestamp": 0,
    }


def test_an_assistant_error_message_writes_error_message_in_camel_case() -> None:
    """SPEC 1: ``errorMessage`` is present when set."""
    message = AssistantMessage(stop_reason="error", error_message="boom")
    assert wire(message)["errorMessage"] == "boom" and wire(message)["stopReason"] == "error"


def test_a_tool_result_writes_is_error_always_and_details_only_when_given() -> None:
    """SPEC 1: ``isError`` is required in pi; ``details?`` is optional."""
    result = ToolResultMessage(tool_call_id="c1", tool_name="echo", content=text_result("hi"))
    assert wire(result) == {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "echo",
        "content": [{"type": "text", "text": "hi"}],
        "isError": False,
        "timestamp": 0,
    }
    assert wire(result.model_copy(update={"details": {"n": 1}}))["details"] == {"n": 1}


def test_content_blocks_leave_out_unset_signatures_and_redacted() -> None:
    """SPEC 1: thinkingSignature?, redacted? (and pi's textSignature?) are left out while unset."""
    assert wire(TextContent(text="a")) == {"type": "text", "text": "a"}
    assert wire(ThinkingContent(thinking="t")) == {"type": "thinking", "thinking": "t"}
    assert wire(ThinkingContent(thinking="t", thinking_signature="reasoning", redacted=True)) == {
        "type": "thinking",
        "thinking": "t",
        "thinkingSignature": "reasoning",
        "redacted": True,
    }
    assert wire(ImageContent(data="AAAA", mime_type="image/png")) == {
        "type": "image",
        "data": "AAAA",
        "mimeType": "image/png",
    }
    assert wire(ToolCall(id="c1", name="echo")) == {
        "type": "toolCall",
        "id": "c1",
        "name": "echo",
        "arguments": {},
    }


def test_a_tool_call_without_arguments_reads_as_empty_arguments() -> None:
    """A toolCall block with no ``arguments`` key is taken with ``{}``."""
    message = MessageAdapter.validate_python(
        {"role": "assistant", "content": [{"type": "toolCall", "id": "c1", "name": "echo"}]}
    )
    assert message.tool_calls[0].arguments == {}


@pytest.mark.parametrize("reason", ["stop", "length", "toolUse", "error", "aborted"])
def test_every_pi_stop_reason_is_read_and_written_back(reason: str) -> None:
    """SPEC 1: the five stop reasons of pi."""
    message = MessageAdapter.validate_python({"role": "assistant", "stopReason": reason})
    assert wire(message)["stopReason"] == reason


def test_an_unknown_stop_reason_is_refused() -> None:
    """A stop reason pi does not have is not silently accepted."""
    with pytest.raises(ValidationError):
        MessageAdapter.validate_python({"role": "assistant", "stopReason": "done"})


def test_a_user_message_without_timestamp_is_taken_with_zero() -> None:
    """A client may send ``{"role":"user","content":"hi"}`` without a timestamp."""
    message = MessageAdapter.validate_python({"role": "user", "content": "hi"})
    assert isinstance(message, UserMessage) and wire(message) == {
        "role": "user",
        "content": "hi",
        "timestamp": 0,
    }


# --- input names, roles, round trips ------------------------------------------


def test_snake_case_names_are_taken_on_input_like_the_camel_case_ones() -> None:
    """README: snake_case names are accepted too; the JSON written is camelCase."""
    snake = MessageAdapter.validate_python(
        {"role": "toolResult", "tool_call_id": "c1", "tool_name": "echo", "is_error": True, "content": []}
    )
    camel = MessageAdapter.validate_python(
        {"role": "toolResult", "toolCallId": "c1", "toolName": "echo", "isError": True, "content": []}
    )
    assert wire(snake) == wire(camel)
    assert wire(snake)["toolCallId"] == "c1" and wire(snake)["isError"] is True


def test_an_unknown_role_is_kept_as_a_custom_message_with_all_its_keys() -> None:
    """SPEC 1: any other role is an application message, kept in the transcript as sent."""
    sent = {"role": "bashExecution", "command": "ls", "exit_code": 0, "output": None, "nested": {"a": [1]}}
    message = MessageAdapter.validate_python(sent)
    assert isinstance(message, CustomMessage)
    assert wire(message) == sent


def test_a_message_without_a_role_is_refused() -> None:
    """Every AgentMessage has a role: a dict without one is not taken as an application message."""
    with pytest.raises(ValidationError):
        MessageAdapter.validate_python({"content": "hi", "timestamp": 1})


def test_each_known_role_decodes_to_its_own_class_from_json_and_from_objects() -> None:
    """The role picks the class, whether the message comes as JSON or as a model already."""
    result = ToolResultMessage(tool_call_id="c1", tool_name="echo")
    for value, cls in [
        ({"role": "user", "content": "hi"}, UserMessage),
        ({"role": "assistant"}, AssistantMessage),
        ({"role": "toolResult", "toolCallId": "c1", "toolName": "echo"}, ToolResultMessage),
        (result, ToolResultMessage),
        (AssistantMessage(), AssistantMessage),
        (user("hi"), UserMessage),
        (CustomMessage(role="note", text="x"), CustomMessage),
    ]:
        assert type(MessageAdapter.validate_python(value)) is cls


def test_a_transcript_round_trips_to_identical_json() -> None:
    """dump -> validate -> dump gives the same JSON (histories, carry, pi session files)."""
    transcript = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "data": "AA", "mimeType": "image/png"},
            ],
            "timestamp": 5,
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "thinkingSignature": "reasoning_content"},
                {"type": "text", "text": "ok"},
                {"type": "toolCall", "id": "c1", "name": "echo", "arguments": {"text": "x"}},
            ],
            "api": "openai-completions",
            "provider": "openai",
            "model": "m",
            "usage": {
                "input": 1,
                "output": 2,
                "cacheRead": 3,
                "cacheWrite": 4,
                "totalTokens": 10,
                "cost": {"input": 0.1, "output": 0.2, "cacheRead": 0.3, "cacheWrite": 0.4, "total": 1.0},
            },
            "stopReason": "toolUse",
            "timestamp": 6,
        },
        {
            "role": "toolResult",
            "toolCallId": "c1",
            "toolName": "echo",
            "content": [{"type": "text", "text": "x"}],
            "details": {},
            "isError": False,
            "timestamp": 7,
        },
        {"role": "note", "text": "kept"},
        {
            "role": "assistant",
            "content": [],
            "api": "a",
            "provider": "p",
            "model": "m",
            "usage": ZERO_USAGE,
            "stopReason": "aborted",
            "errorMessage": "stopped",
            "timestamp": 8,
        },
    ]
    decoded = MessageList.validate_python(transcript)
    assert wire(decoded) == transcript
    assert wire(MessageList.validate_json(MessageList.dump_json(decoded))) == transcript


def test_assistant_text_joins_its_text_blocks_without_separator() -> None:
    """``AssistantMessage.text`` is the text blocks as streamed, concatenated."""
    message = AssistantMessage(
        content=[TextContent(text="a"), ThinkingContent(thinking="t"), TextContent(text="b")]
    )
    assert message.text == "ab"


def test_a_text_result_keeps_the_text_exactly() -> None:
    """A tool's text result reaches the model as returned, whitespace included."""
    assert wire(text_result("  two\n lines \n")) == [{"type": "text", "text": "  two\n lines \n"}]


# --- usage totals --------------------------------------------------------------


def test_usage_plus_adds_every_count_and_every_cost() -> None:
    """Session usage totals (``state.usage``, maxTotalTokens, maxCost) add each field to itself."""
    a = Usage(
        input=1,
        output=2,
        cache_read=3,
        cache_write=4,
        total_tokens=10,
        cost=Cost(input=0.5, output=1.0, cache_read=1.5, cache_write=2.0, total=5.0),
    )
    b = Usage(
        input=10,
        output=20,
        cache_read=30,
        cache_write=40,
        total_tokens=100,
        cost=Cost(input=5.0, output=10.0, cache_read=15.0, cache_write=20.0, total=50.0),
    )
    assert wire(a.plus(b)) == {
        "input": 11,
        "output": 22,
        "cacheRead": 33,
        "cacheWrite": 44,
        "totalTokens": 110,
        "cost": {"input": 5.5, "output": 11.0, "cacheRead": 16.5, "cacheWrite": 22.0, "total": 55.0},
    }


# --- events --------------------------------------------------------------------


def test_message_start_leaves_out_attempt_and_queue_unless_set() -> None:
    """README: ``attempt`` only on a streamed assistant message, ``queue`` only for a queued one."""
    event = MessageStartEvent(message=user("hi"))
    assert wire(event) == {
        "type": "message_start",
        "message": {"role": "user", "content": "hi", "timestamp": 1},
    }
    assert wire(MessageStartEvent(message=user("hi"), queue="followUp"))["queue"] == "followUp"


def test_turn_end_writes_tool_results_and_never_the_model_turn_flag() -> None:
    """SPEC 2: ``turn_end{message, toolResults}``; ``model_turn`` is never on the wire."""
    event = TurnEndEvent(message=AssistantMessage(), tool_results=[], model_turn=False)
    assert set(wire(event)) == {"type", "message", "toolResults"}


def test_tool_execution_end_always_writes_is_error() -> None:
    """SPEC 2: ``tool_execution_end{toolCallId, toolName, result, isError}``."""
    event = ToolExecutionEndEvent(tool_call_id="c1", tool_name="echo", result={"content": []}, is_error=False)
    assert wire(event) == {
        "type": "tool_execution_end",
        "toolCallId": "c1",
        "toolName": "echo",
        "result": {"content": []},
        "isError": False,
    }
    with pytest.raises(ValidationError):
        EventAdapter.validate_python(
            {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "echo", "result": None}
        )


def test_every_event_type_is_read_back_from_its_json() -> None:
    """A subscriber decodes every event the stream carries, retries and approvals included."""
    events = [
        {"type": "agent_start"},
        {"type": "agent_end", "messages": []},
        {"type": "turn_start"},
        {"type": "turn_end", "message": wire(AssistantMessage()), "toolResults": []},
        {"type": "message_start", "message": wire(AssistantMessage()), "attempt": 2},
        {
            "type": "message_update",
            "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": "a"},
        },
        {"type": "message_end", "message": wire(user("hi"))},
        {"type": "message_retry", "attempt": 2, "reason": "503"},
        {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "echo", "args": {}},
        {
            "type": "tool_execution_update",
            "toolCallId": "c1",
            "toolName": "echo",
            "args": {},
            "partialResult": "p",
        },
        {
            "type": "tool_execution_retry",
            "toolCallId": "c1",
            "toolName": "echo",
            "attempt": 2,
            "reason": "gone",
        },
        {
            "type": "tool_approval_request",
            "toolCallId": "c1",
            "toolName": "echo",
            "args": {},
            "reason": "why",
        },
        {"type": "tool_execution_end", "toolCallId": "c1", "toolName": "echo", "result": {}, "isError": True},
    ]
    for event in events:
        assert wire(EventAdapter.validate_python(event)) == event
    assert wire(MessageRetryEvent(attempt=2)) == {"type": "message_retry", "attempt": 2}


def test_events_go_on_the_topic_named_events() -> None:
    """SPEC 7: subscribers in any language read the Workflow Stream topic ``events``."""
    assert EVENTS_TOPIC == "events"


# --- internal models whose defaults the workflow relies on -----------------------


def test_a_tool_outcome_given_null_details_gets_empty_details() -> None:
    """A ToolResult whose details are None gives ``details: {}``; a plain string result gives none."""
    assert ToolOutcome(content=text_result("x"), details=None).details == {}
    assert ToolOutcome.model_validate({"content": [], "details": None}).details == {}
    assert ToolOutcome(content=text_result("x")).details is None
    assert ToolOutcome(content=text_result("x"), details=[1]).details == [1]


def test_a_tool_declaration_defaults_to_an_object_schema_five_minutes_and_no_approval() -> None:
    """A declared tool with only a name: takes an object, runs remotely, 300 s, no approval."""
    tool = ToolDeclaration(name="t")
    assert tool.parameters == {"type": "object"} and tool.timeout_seconds == 300.0
    assert not tool.requires_approval and not tool.local and tool.execution_mode is None


def test_a_run_state_defaults_to_no_turn_and_no_pending_tool_calls() -> None:
    """A carried run without these keys resumes at the start of its first turn."""
    state = RunState(started_at_message=3)
    assert (state.turns, state.has_more_tool_calls, state.stop_requested, state.batch) == (
        0,
        False,
        False,
        None,
    )


def test_a_view_that_keeps_nulls_does_not_make_its_parent_write_nulls() -> None:
    """The settings in force write every key (null where unset); the start input and carry leave them out."""
    assert wire(SettingsInForce())["maxTurns"] is None
    assert "maxTurns" not in wire(AgentSettings())
    assert "carry" not in wire(SessionInput()) and "prompt" not in wire(SessionInput())
    assert "run" not in wire(SessionCarry()) and "pending" not in wire(SessionCarry())


# --- queues ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "one_at_a_time", "All", ""])
def test_a_queue_mode_pi_does_not_have_is_refused(mode: str) -> None:
    """SPEC 8: a bad queue mode is refused (only ``one-at-a-time`` and ``all``)."""
    with pytest.raises(ValidationError):
        AgentSettings.model_validate({"steeringMode": mode})
    assert (
        AgentSettings.model_validate({"steeringMode": "all", "followUpMode": "one-at-a-time"}).steering_mode
        == "all"
    )


def test_polling_an_empty_queue_gives_nothing_in_both_modes() -> None:
    """SPEC 3: a poll of an empty queue gives no message (the loop then stops)."""
    for mode in ("one-at-a-time", "all"):
        assert MessageQueue(mode).poll() == []  # type: ignore[arg-type]


def test_a_one_at_a_time_queue_drains_in_arrival_order_one_per_poll() -> None:
    """SPEC 3: one-at-a-time drains the oldest message at each poll."""
    queue = MessageQueue("one-at-a-time")
    for arrival, text in enumerate("abc", start=1):
        queue.push(user(text), arrival)
    assert [texts(queue.poll()) for _ in range(4)] == [["a"], ["b"], ["c"], []]
    assert len(queue) == 0


def test_an_all_queue_drains_everything_in_one_poll() -> None:
    """SPEC 3: ``all`` drains the whole queue at each poll."""
    queue = MessageQueue("all")
    for arrival, text in enumerate("abc", start=1):
        queue.push(user(text), arrival)
    assert texts(queue.poll()) == ["a", "b", "c"]
    assert queue.poll() == [] and len(queue) == 0


def test_a_one_at_a_time_poll_keeps_the_remaining_arrival_numbers() -> None:
    """clear_queues returns what is left with its own arrival numbers after a poll."""
    queue = MessageQueue("one-at-a-time")
    for arrival, text in [(7, "a"), (8, "b"), (9, "c")]:
        queue.push(user(text), arrival)
    queue.poll()
    assert [(n, texts([m])[0]) for n, m in queue.clear()] == [(8, "b"), (9, "c")]
    assert queue.clear() == [] and len(queue) == 0


def test_an_all_poll_then_clear_returns_only_later_messages() -> None:
    """After an ``all`` poll the arrival numbers of the drained messages are gone too."""
    queue = MessageQueue("all")
    queue.push(user("a"), 1)
    queue.poll()
    queue.push(user("b"), 2)
    assert [(n, texts([m])[0]) for n, m in queue.clear()] == [(2, "b")]


def test_a_carried_queue_keeps_its_arrival_numbers() -> None:
    """A continue-as-new hands over the arrival numbers; they are kept, not recomputed."""
    queue = MessageQueue("one-at-a-time", [user("a"), user("b")], [4, 9])
    assert [n for n, _ in queue.clear()] == [4, 9]


def test_a_carried_queue_without_arrival_numbers_numbers_them_by_timestamp() -> None:
    """A carry from an older version (no arrivals) numbers its messages by timestamp."""
    messages: list[AgentMessage] = [
        UserMessage(content="a", timestamp=30),
        UserMessage(content="b", timestamp=40),
    ]
    queue = MessageQueue("all", messages)
    assert [n for n, _ in queue.clear()] == [30, 40]


def test_a_queue_does_not_share_its_lists_with_the_carry_or_the_snapshot() -> None:
    """Draining the queue leaves the carried list and an earlier snapshot as they were."""
    carried: list[AgentMessage] = [user("a"), user("b")]
    queue = MessageQueue("one-at-a-time", carried, [1, 2])
    snapshot = queue.snapshot()
    queue.poll()
    snapshot.append(user("z"))
    assert texts(carried) == ["a", "b"]
    assert len(queue) == 1 and texts(queue.snapshot()) == ["b"]
