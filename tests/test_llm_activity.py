"""The model activity's set-up on a worker: its client is made when the
worker starts (the first answer after a start or a crash does not wait for
it), and a worker without an API key says so on the call."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import httpx2
import openai
import pytest
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment

from activities.events import ActivityEventPublisher
from activities.heartbeat import will_retry
from activities.llm import LlmActivities, _classify, _RetryNotice
from activities.openai_chat import (
    MAX_TOOL_CALLS_PER_ANSWER,
    ConversionMemo,
    StreamAssembler,
    StreamEndedEarly,
    completion_as_chunk,
    to_openai_messages,
    usage_from_openai,
)
from testbed.scripted_model.server import tool_message_problem
from tests.support.tools import PIXEL_PNG
from workflows.arguments import MAX_NESTING
from workflows.contract import LlmRequest
from workflows.models import (
    AgentMessage,
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

REQUEST = LlmRequest(model="m", messages=[UserMessage(content="hi", timestamp=0)], turn=1)


async def test_without_an_api_key_the_call_says_what_to_set() -> None:
    llm = LlmActivities(api_key=None)
    llm.warm_up()  # nothing to make: no key
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(llm.stream_assistant_response, REQUEST)
    assert raised.value.type == "ModelConfigError"
    assert raised.value.non_retryable
    assert "OPENAI_API_KEY is not set on the worker" in str(raised.value)


def test_the_model_client_is_made_at_start_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    real = openai.AsyncOpenAI

    def counting(**kwargs: Any) -> openai.AsyncOpenAI:
        made.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(openai, "AsyncOpenAI", counting)
    llm = LlmActivities(api_key="k", base_url="http://127.0.0.1:9/v1")
    llm.warm_up()
    llm.warm_up()
    assert [m["base_url"] for m in made] == ["http://127.0.0.1:9/v1"]
    assert made[0]["max_retries"] == 0  # Temporal retries, not the client


def _tool_chunk(
    index: int, *, call_id: str | None = None, name: str | None = None, args: str = ""
) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        call["id"] = call_id
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


def _outline(events: list[dict[str, Any]]) -> list[str]:
    return [f"{e['type']}:{e['contentIndex']}" for e in events if e["type"] != "toolcall_delta"]


def test_each_block_ends_before_the_next_starts_tool_calls_too() -> None:
    """pi's order: text, then each tool call closed (with its parsed
    arguments) before the next block starts, not all at the end."""
    assembler = StreamAssembler("m")
    events = assembler.feed({"choices": [{"index": 0, "delta": {"content": "Let me check."}}]})
    events += assembler.feed(_tool_chunk(0, call_id="a", name="echo", args='{"text": '))
    events += assembler.feed(_tool_chunk(0, args='"1"}'))
    events += assembler.feed(_tool_chunk(1, call_id="b", name="echo", args='{"text": "2"}'))
    events += assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, closing = assembler.finish()
    events += closing
    assert _outline(events) == [
        "text_start:0",
        "text_delta:0",
        "text_end:0",
        "toolcall_start:1",
        "toolcall_end:1",
        "toolcall_start:2",
        "toolcall_end:2",
    ]
    ends = [e["toolCall"] for e in events if e["type"] == "toolcall_end"]
    assert [(c["id"], c["arguments"]) for c in ends] == [("a", {"text": "1"}), ("b", {"text": "2"})]
    assert errors == {} and message.stop_reason == "toolUse"
    assert message.timestamp == assembler.timestamp


def test_interleaved_tool_call_deltas_still_give_whole_calls() -> None:
    """A provider that interleaves parallel calls' deltas: a delta for a
    closed call reopens it, and its last toolcall_end has every argument."""
    assembler = StreamAssembler("m")
    events = assembler.feed(_tool_chunk(0, call_id="a", name="echo", args='{"text"'))
    events += assembler.feed(_tool_chunk(1, call_id="b", name="echo", args='{"text": "2"}'))
    events += assembler.feed(_tool_chunk(0, args=': "1"}'))
    events += assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, closing = assembler.finish()
    events += closing
    last_end = {e["contentIndex"]: e["toolCall"] for e in events if e["type"] == "toolcall_end"}
    assert last_end[0]["arguments"] == {"text": "1"} and last_end[1]["arguments"] == {"text": "2"}
    assert [c.arguments for c in message.content] == [{"text": "1"}, {"text": "2"}]
    assert errors == {}


def test_a_call_whose_arguments_are_not_json_is_reported_once_closed() -> None:
    assembler = StreamAssembler("m")
    assembler.feed(_tool_chunk(0, call_id="j1", name="echo", args='{"text": unterminated'))
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, closing = assembler.finish()
    assert message.content[0].arguments == {}
    assert list(errors) == ["j1"] and "received" in errors["j1"]
    assert [e["type"] for e in closing] == ["toolcall_end"]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "reasoning_text"])
def test_reasoning_goes_back_to_the_model_in_the_field_it_came_in(field: str) -> None:
    """pi keeps the field a thinking block streamed in as its
    ``thinkingSignature`` and sends the reasoning back in that field on the
    next request (llama.cpp's gpt-oss, reasoning models calling tools)."""
    assembler = StreamAssembler("m")
    assembler.feed({"choices": [{"index": 0, "delta": {field: "plan "}}]})
    assembler.feed({"choices": [{"index": 0, "delta": {field: "A"}}]})
    assembler.feed(_tool_chunk(0, call_id="c1", name="echo", args='{"text": "1"}'))
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, _, _ = assembler.finish()
    assert message.content[0].model_dump() == {
        "type": "thinking",
        "thinking": "plan A",
        "thinkingSignature": field,
    }
    sent = to_openai_messages(None, [UserMessage(content="hi", timestamp=0), message])[1]
    assert sent[field] == "plan A" and sent["tool_calls"][0]["id"] == "c1"


def test_a_thinking_signature_that_is_no_reasoning_field_is_not_sent() -> None:
    """A transcript given at start could carry any signature: only a
    reasoning field goes back, never a key such as ``role``."""
    message = AssistantMessage(
        content=[ThinkingContent(thinking="x", thinking_signature="role"), TextContent(text="so")],
        stop_reason="stop",
        timestamp=0,
    )
    assert to_openai_messages(None, [message]) == [{"role": "assistant", "content": "so"}]


def test_an_answer_with_no_text_and_no_calls_is_not_sent_and_blank_parts_are_left_out() -> None:
    """As pi's conversion: servers refuse an assistant message with neither
    content nor tool calls (a thinking-only, blank or empty answer); the
    port sent ``{"role": "assistant", "content": ""}`` (a pi parity audit)."""
    user = UserMessage(content="hi", timestamp=0)
    thinking_only = AssistantMessage(
        content=[ThinkingContent(thinking="hmm", thinking_signature="reasoning_content")],
        stop_reason="stop",
        timestamp=0,
    )
    blank = AssistantMessage(content=[TextContent(text="  \n")], stop_reason="stop", timestamp=0)
    empty = AssistantMessage(content=[], stop_reason="stop", timestamp=0)
    parts = AssistantMessage(
        content=[TextContent(text="a"), TextContent(text=" "), TextContent(text="b")],
        stop_reason="stop",
        timestamp=0,
    )
    sent = to_openai_messages(None, [user, thinking_only, user, blank, empty, user, parts])
    assert [m["role"] for m in sent] == ["user", "user", "user", "assistant"]
    assert sent[-1] == {"role": "assistant", "content": "ab"}


def test_half_an_emoji_from_the_model_is_replaced_not_fatal() -> None:
    """A lone surrogate (``"\\ud83d"`` escaped in the chunk or in a tool
    call's arguments) cannot be encoded: the answer failed to serialize and
    the model was called again, five times. It becomes U+FFFD."""
    assembler = StreamAssembler("m")
    events = assembler.feed({"choices": [{"index": 0, "delta": {"content": "hi \ud83d"}}]})
    events += assembler.feed(_tool_chunk(0, call_id="c\ud83d", name="echo", args='{"text": "\\ud83d"}'))
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, closing = assembler.finish()
    assert message.text == "hi \ufffd" and message.tool_calls[0].arguments == {"text": "\ufffd"}
    assert errors == {}
    message.model_dump_json()
    json.dumps(events + closing, ensure_ascii=False).encode("utf-8")


def test_two_calls_of_one_answer_with_one_id_get_ids_of_their_own() -> None:
    """Results pair up with calls by id: a model that gives two calls one id
    (seen with local servers) would have one call's result, abort or
    argument check taken for the other's."""
    assembler = StreamAssembler("m")
    assembler.feed(_tool_chunk(0, call_id="same", name="echo", args='{"text": "1"}'))
    assembler.feed(_tool_chunk(1, call_id="same", name="echo", args="{not json"))
    assembler.feed(_tool_chunk(2, call_id="same", name="echo", args='{"text": "3"}'))
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, _ = assembler.finish()
    assert [c.id for c in message.tool_calls] == ["same", "same_2", "same_3"]
    assert list(errors) == ["same_2"]


def test_an_answer_with_too_many_tool_calls_ends_as_an_error_with_none_of_them() -> None:
    """The workflow's work on one answer grows with its calls; past the
    cap it would outlast the SDK's deadlock check on every attempt. The
    assembler stops at the first call past it: the text is kept, no call
    is left to run, and the message says why."""
    assembler = StreamAssembler("m")
    assembler.feed({"choices": [{"index": 0, "delta": {"content": "On it."}}]})
    for i in range(MAX_TOOL_CALLS_PER_ANSWER):
        assembler.feed(_tool_chunk(i, call_id=f"c{i}", name="echo", args='{"text": "x"}'))
    assert not assembler.too_many_calls  # the cap itself is allowed
    assert assembler.feed(_tool_chunk(MAX_TOOL_CALLS_PER_ANSWER, call_id="over", name="echo")) == []
    assert assembler.too_many_calls
    message, errors, closing = assembler.finish()  # no finish_reason: the stream was left
    assert message.stop_reason == "error" and message.tool_calls == [] and errors == {}
    assert message.text == "On it."
    assert message.error_message == (
        f"The model asked for more than {MAX_TOOL_CALLS_PER_ANSWER:,} tool calls in one answer, "
        "so none of them ran."
    )
    assert all(e["type"] != "toolcall_end" for e in closing)


def test_an_answer_with_as_many_tool_calls_as_allowed_runs_them_all() -> None:
    assembler = StreamAssembler("m")
    for i in range(MAX_TOOL_CALLS_PER_ANSWER):
        assembler.feed(_tool_chunk(i, call_id=f"c{i}", name="echo", args='{"text": "x"}'))
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, _ = assembler.finish()
    assert errors == {}
    assert message.stop_reason == "toolUse" and len(message.tool_calls) == MAX_TOOL_CALLS_PER_ANSWER


def test_usage_takes_only_token_counts() -> None:
    """What a model server reports is bounded: no negative, fractional or
    textual count reaches the transcript, and no count past 2**53 - 1."""
    usage = usage_from_openai(
        "m",
        {
            "prompt_tokens": 2**70,
            "completion_tokens": -5,
            "total_tokens": "many",
            "prompt_tokens_details": {"cached_tokens": 3.5},
        },
    )
    assert (usage.input, usage.output, usage.cache_read) == (2**53 - 1, 0, 0)
    assert usage.total_tokens == 2**53 - 1
    assert usage_from_openai("m", {"prompt_tokens": 12.0, "completion_tokens": True}).input == 12
    assert (
        usage_from_openai("m", {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}).input
        == 0
    )
    assert usage_from_openai("m", ["not", "an", "object"]).total_tokens == 0  # type: ignore[arg-type]


def test_an_image_goes_to_the_model_as_clean_base64_or_as_a_note() -> None:
    """Line breaks (base64.encodebytes) and missing padding are taken and
    sent without them; what no model would read goes as a note instead, so
    the call (and every later one) is not refused for it."""
    png = base64.b64decode(PIXEL_PNG) + bytes(range(100))  # long enough to wrap
    wrapped = base64.encodebytes(png).decode()  # a line break every 76 characters
    images = [
        ImageContent(data=wrapped, mime_type="image/png"),
        ImageContent(data=base64.b64encode(png).decode().rstrip("="), mime_type="image/png"),
        ImageContent(data="not base64!", mime_type="image/png"),
        ImageContent(data=wrapped, mime_type="application/pdf"),
        ImageContent(
            data=wrapped, mime_type="IMAGE/PNG; charset=binary"
        ),  # MIME types are not case-sensitive
    ]
    [message] = to_openai_messages(None, [UserMessage(content=images, timestamp=0)])
    clean = f"data:image/png;base64,{base64.b64encode(png).decode()}"
    assert message["content"][0] == {"type": "image_url", "image_url": {"url": clean}}
    assert message["content"][1] == {"type": "image_url", "image_url": {"url": clean}}
    assert message["content"][2] == {
        "type": "text",
        "text": "[An image was left out: its data is not valid base64.]",
    }
    assert message["content"][3]["text"].startswith("[An image was left out: its mimeType 'application/pdf'")
    assert message["content"][4] == {"type": "image_url", "image_url": {"url": clean}}


def _turn(*call_ids: str, stop_reason: str = "toolUse") -> AssistantMessage:
    return AssistantMessage.model_validate(
        {
            "content": [ToolCall(id=i, name="picture") for i in call_ids],
            "stopReason": stop_reason,
            "timestamp": 0,
        }
    )


def _result(call_id: str, *, image: bool = False) -> ToolResultMessage:
    content: list[TextContent | ImageContent] = [TextContent(text=f"result {call_id}")]
    if image:
        content.append(ImageContent(data=PIXEL_PNG, mime_type="image/png"))
    return ToolResultMessage(tool_call_id=call_id, tool_name="picture", content=content)


def test_tool_result_images_follow_all_of_the_batch_tool_messages() -> None:
    """Chat Completions refuses (400) an assistant message whose tool_calls
    are not answered by the tool messages right after it: the images of a
    batch's results go after the last of them, in one user message."""
    sent = to_openai_messages(
        None,
        [
            UserMessage(content="go", timestamp=0),
            _turn("a", "b", "c"),
            _result("a", image=True),
            _result("b"),
            _result("c", image=True),
            UserMessage(content="steer", timestamp=0),
        ],
    )
    assert [(m["role"], m.get("tool_call_id")) for m in sent] == [
        ("user", None),
        ("assistant", None),
        ("tool", "a"),
        ("tool", "b"),
        ("tool", "c"),
        ("user", None),
        ("user", None),
    ]
    images = sent[5]["content"]
    assert [part.get("text", part["type"]) for part in images] == [
        "Image(s) returned by tool picture:",
        "image_url",
        "Image(s) returned by tool picture:",
        "image_url",
    ]
    assert tool_message_problem(sent) is None


def test_results_of_a_left_out_assistant_turn_are_left_out_too() -> None:
    """An assistant turn that failed is not sent; a `tool` message answering
    one of its calls would answer nothing the model is sent (400)."""
    sent = to_openai_messages(
        None,
        [
            UserMessage(content="go", timestamp=0),
            _turn("a", stop_reason="error"),
            _result("a", image=True),
            UserMessage(content="again", timestamp=0),
            _turn("a"),
            _result("a"),
        ],
    )
    assert [(m["role"], m.get("tool_call_id")) for m in sent] == [
        ("user", None),
        ("user", None),
        ("assistant", None),
        ("tool", "a"),
    ]
    assert tool_message_problem(sent) is None


def test_a_call_left_without_a_result_is_answered_and_a_stray_result_left_out() -> None:
    """A transcript given at the start may hold a call without its result,
    or a result of no call: as sent, every model call was refused (400).
    pi answers such a call "No result provided" when the next message comes."""
    sent = to_openai_messages(
        None,
        [
            UserMessage(content="go", timestamp=0),
            _turn("a", "b"),
            _result("b", image=True),
            _result("z"),
            UserMessage(content="and?", timestamp=0),
            _turn("c"),
        ],
    )
    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in sent if m["role"] != "user"] == [
        ("assistant", None, None),
        ("tool", "b", "result b"),
        ("tool", "a", "No result provided"),
        ("assistant", None, None),
        ("tool", "c", "No result provided"),
    ]
    assert [m["role"] for m in sent] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
        "user",
        "assistant",
        "tool",
    ]
    assert tool_message_problem(sent) is None


@pytest.mark.parametrize("memo", [None, ConversionMemo()], ids=["fresh", "kept"])
def test_a_start_transcript_repeating_a_call_id_is_sent_with_one_result_per_call(
    memo: ConversionMemo | None,
) -> None:
    """A transcript given at the start may repeat a call id in one message
    (the model's own answers cannot); the server pairs calls and results by
    id, so two calls `d` with one result were refused (400) on every later
    model call of the conversation. A repeat goes as `d_2`, answered in
    order, or "No result provided"; an id taken already is skipped."""
    messages: list[AgentMessage] = [
        GO,
        _turn("d", "d", "d_2", "d"),
        _result("d"),
        _result("d_2"),
        _result("d"),
        UserMessage(content="and?", timestamp=0),
        _turn("x" * 50, "x" * 50),
        _result("x" * 50),
    ]
    for _ in range(2):  # the second time from what the memo kept
        sent = to_openai_messages(None, messages, memo)
        assert [c["id"] for c in sent[1]["tool_calls"]] == ["d", "d_3", "d_2", "d_4"]
        assert [(m.get("tool_call_id"), m.get("content")) for m in sent[2:6]] == [
            ("d", "result d"),
            ("d_2", "result d_2"),
            ("d_3", "result d"),
            ("d_4", "No result provided"),
        ]
        long_ids = [c["id"] for c in sent[7]["tool_calls"]]
        assert len(set(long_ids)) == 2 and all(len(i) <= 40 for i in long_ids)
        assert [(m.get("tool_call_id"), m.get("content")) for m in sent[8:]] == [
            (long_ids[0], "result " + "x" * 50),
            (long_ids[1], "No result provided"),
        ]
        assert tool_message_problem(sent) is None


def test_the_scripted_model_refuses_tool_messages_out_of_order() -> None:
    calls = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": i, "function": {"name": "echo", "arguments": "{}"}} for i in "ab"],
    }
    assert (
        tool_message_problem(
            [calls, {"role": "tool", "tool_call_id": "a"}, {"role": "tool", "tool_call_id": "b"}]
        )
        is None
    )
    unanswered = tool_message_problem([calls, {"role": "tool", "tool_call_id": "a"}, {"role": "user"}])
    assert unanswered is not None and unanswered.endswith("did not have response messages: b")
    stray = tool_message_problem([{"role": "user"}, {"role": "tool", "tool_call_id": "a"}])
    assert stray is not None and "must be a response to a preceding message" in stray


async def test_a_context_transform_calling_sys_exit_fails_the_call_not_the_worker() -> None:
    """SystemExit is no Exception: going up from the activity it stopped the
    worker process. It ends the run with the transform's failure instead."""

    def leaving(messages: list[Any]) -> list[Any]:
        raise SystemExit(2)

    llm = LlmActivities(api_key="k", base_url="http://127.0.0.1:9/v1", transform_context=leaving)
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(llm.stream_assistant_response, REQUEST)
    assert raised.value.type == "ContextHookFailed" and raised.value.non_retryable
    assert "The context transform failed: SystemExit: 2" in str(raised.value)


async def test_a_failing_convert_to_llm_is_named_in_the_error() -> None:
    """It was reported as a context transform failure."""

    def failing(messages: list[Any]) -> list[Any]:
        raise RuntimeError("convert failed")

    llm = LlmActivities(api_key="k", base_url="http://127.0.0.1:9/v1", convert_to_llm=failing)
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(llm.stream_assistant_response, REQUEST)
    assert raised.value.type == "ContextHookFailed" and raised.value.non_retryable
    said = raised.value.message
    assert said == "The message conversion (convert_to_llm) failed: RuntimeError: convert failed"


class _Unreadable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str exploded")


def _raises_unreadably(messages: list[Any]) -> list[Any]:
    raise _Unreadable()


@pytest.mark.parametrize(
    ("hook", "said"),
    [
        (
            {"convert_to_llm": lambda messages: None},
            "failed: TypeError: it returned NoneType, not a list of messages",
        ),
        (
            {"convert_to_llm": lambda messages: "garbage"},
            "failed: TypeError: it returned str, not a list of messages",
        ),
        (
            {"convert_to_llm": lambda messages: [1, 2]},
            "failed: TypeError: it returned a list holding a int, not only messages",
        ),
        (
            {"transform_context": _raises_unreadably},
            "The context transform failed: _Unreadable (its message could not be read: RuntimeError)",
        ),
    ],
    ids=["none", "text", "not-messages", "unreadable-failure"],
)
async def test_what_a_context_hook_returns_or_raises_ends_the_run_with_a_sentence_not_retries(
    hook: dict[str, Any], said: str
) -> None:
    """A `convert_to_llm` returning None failed after the hook's clause,
    and a failure whose message could not be read failed inside it: either
    way the model call was retried five times, then ended with Python's
    words (a robustness audit). Now a final error naming the hook."""
    llm = LlmActivities(api_key="k", base_url="http://127.0.0.1:9/v1", **hook)
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(llm.stream_assistant_response, REQUEST)
    assert raised.value.type == "ContextHookFailed" and raised.value.non_retryable
    assert said in raised.value.message


async def test_a_context_with_nothing_to_send_ends_the_run_without_a_warning_in_the_log() -> None:
    """An application message steered while idle is a normal turn of a
    conversation: the run ends with the sentence, and the worker's log had a
    warning with a traceback for it every time (a robustness audit). Marked
    benign, the SDK logs it at DEBUG."""
    llm = LlmActivities(api_key="k", base_url="http://127.0.0.1:9/v1")
    request = REQUEST.model_copy(update={"messages": []})
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(llm.stream_assistant_response, request)
    assert raised.value.type == "EmptyContext" and raised.value.non_retryable
    assert raised.value.category == ApplicationErrorCategory.BENIGN


def test_call_ids_and_names_openai_would_refuse_are_sent_as_ones_it_takes() -> None:
    """A call id over 40 characters (pi's Responses ids `call_...|fc_...`,
    vLLM's 46-character ones) or a tool name the model made up
    (`multi_tool_use.parallel`, an empty one) made OpenAI refuse every later
    call (400). The id is cut with a digest, the same in the call and its
    result; the name made one OpenAI takes (its result says not found)."""
    long_id = "call_" + "x" * 30 + "|fc_" + "y" * 45
    sibling = long_id[:-1] + "z"  # the same first 40 characters
    message = AssistantMessage.model_validate(
        {
            "content": [
                ToolCall(id=long_id, name="multi_tool_use.parallel"),
                ToolCall(id=sibling, name=""),
                ToolCall(id="short", name="echo"),
            ],
            "stopReason": "toolUse",
            "timestamp": 0,
        }
    )
    results = [
        ToolResultMessage(tool_call_id=i, tool_name="x", content=[TextContent(text="Tool x not found")])
        for i in (long_id, sibling, "short")
    ]
    sent = to_openai_messages(None, [UserMessage(content="go", timestamp=0), message, *results])
    calls = sent[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["multi_tool_use_parallel", "unknown_tool", "echo"]
    ids = [c["id"] for c in calls]
    assert ids[2] == "short" and len(set(ids)) == 3 and all(len(i) <= 40 for i in ids)
    assert [m["tool_call_id"] for m in sent[2:]] == ids
    assert tool_message_problem(sent) is None


def test_a_new_call_id_at_an_index_in_use_is_another_call() -> None:
    """Some Ollama versions stream every call of an answer at index 0: the
    second call was appended to the first (its arguments `{..}{..}`, an
    error result) and lost."""
    assembler = StreamAssembler("m")
    assembler.feed(_tool_chunk(0, call_id="call_1", name="echo", args='{"text": "a"}'))
    assembler.feed(_tool_chunk(0, call_id="call_2", name="echo", args='{"text":'))
    assembler.feed(_tool_chunk(0, args=' "b"}'))
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    message, errors, _ = assembler.finish()
    assert [(c.id, c.arguments) for c in message.tool_calls] == [
        ("call_1", {"text": "a"}),
        ("call_2", {"text": "b"}),
    ]
    assert errors == {}


def test_a_user_message_with_no_content_is_not_sent() -> None:
    """A start transcript may hold `{"role": "user", "content": []}`:
    OpenAI refuses an empty content array (400), every call."""
    sent = to_openai_messages(
        None,
        [
            UserMessage(content=[], timestamp=0),
            UserMessage(content="", timestamp=0),
            UserMessage(content="next", timestamp=0),
        ],
    )
    assert sent == [{"role": "user", "content": "next"}]


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def test_content_as_a_list_of_parts_is_text_and_thinking() -> None:
    """Mistral streams content as parts: `'list' object has no attribute
    'encode'` failed every attempt of every answer (found by a provider audit)."""
    assembler = StreamAssembler("m")
    assembler.feed(
        _chunk(
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "hm"}]}],
            }
        )
    )
    assembler.feed(_chunk({"content": [{"type": "text", "text": "list "}, "content"]}))
    assembler.feed(_chunk({}, "stop"))
    message, _, _ = assembler.finish()
    assert [type(b).__name__ for b in message.content] == ["ThinkingContent", "TextContent"]
    assert message.content[0].thinking == "hm" and message.content[1].text == "list content"
    assert message.content[0].thinking_signature is None  # not a field to send back
    assert message.stop_reason == "stop"


def test_arguments_as_an_object_and_a_numeric_id_are_taken() -> None:
    """llama-server has sent arguments as a JSON object; an id may be a number."""
    assembler = StreamAssembler("m")
    call = {
        "index": 0,
        "id": 7,
        "type": "function",
        "function": {"name": "calc", "arguments": {"expression": "5*5"}},
    }
    assembler.feed(_chunk({"tool_calls": [call]}))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [("7", "calc", {"expression": "5*5"})]
    assert errors == {} and message.stop_reason == "toolUse"


def test_pieces_of_arguments_without_index_continue_their_call() -> None:
    """A delta with no index, no id and no name is the rest of the last
    call's arguments; it was taken for a new call (two broken calls)."""
    assembler = StreamAssembler("m")
    first = {"type": "function", "id": "call_f", "function": {"name": "calc", "arguments": '{"expression":'}}
    assembler.feed(_chunk({"tool_calls": [first]}))
    assembler.feed(_chunk({"tool_calls": [{"type": "function", "function": {"arguments": '"3+4"}'}}]}))
    whole = {"type": "function", "function": {"name": "echo", "arguments": '{"text": "x"}'}}
    assembler.feed(_chunk({"tool_calls": [whole]}))  # a name: another call
    assembler.feed(_chunk({"tool_calls": [{"id": "call_f", "function": {"arguments": ""}}]}))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [
        ("call_f", "calc", {"expression": "3+4"}),
        ("call_1", "echo", {"text": "x"}),
    ]
    assert errors == {}


def test_an_id_sent_after_the_first_delta_does_not_split_the_call() -> None:
    assembler = StreamAssembler("m")
    assembler.feed(_tool_chunk(0, name="calc", args='{"expression":'))
    assembler.feed(_tool_chunk(0, call_id="call_late", args=' "1"}'))
    assembler.feed(_tool_chunk(0, call_id="call_late"))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    assert [(c.id, c.arguments) for c in message.tool_calls] == [("call_0", {"expression": "1"})]
    assert errors == {}


def test_another_function_at_an_index_in_use_without_ids_is_another_call() -> None:
    """Two calls at index 0 without ids: the second's arguments were appended
    to the first's (`{..}{}`, an error) and the second call was lost."""
    assembler = StreamAssembler("m")
    assembler.feed(_tool_chunk(0, name="calc", args='{"expression": "1+1"}'))
    assembler.feed(_tool_chunk(0, name="list_files", args="{}"))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    assert [(c.name, c.arguments) for c in message.tool_calls] == [
        ("calc", {"expression": "1+1"}),
        ("list_files", {}),
    ]
    assert errors == {}


def test_calls_without_index_sharing_one_id_stay_apart() -> None:
    """A server that gives every call of an answer one id and no index:
    the second call's arguments were appended to the first's (found by review)."""
    assembler = StreamAssembler("m")
    for name, args in (("f", '{"a": 1}'), ("g", '{"b": 2}')):
        call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}
        assembler.feed(_chunk({"tool_calls": [call]}))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [
        ("call_0", "f", {"a": 1}),
        ("call_0_2", "g", {"b": 2}),
    ]
    assert errors == {}


def _call(*, call_id: str | None = None, name: str | None = None, args: str | None = None) -> dict[str, Any]:
    """A tool call delta without index."""
    function = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    return {"tool_calls": [{"function": function, **({"id": call_id} if call_id else {})}]}


@pytest.mark.parametrize("indexed", [True, False], ids=["with index", "without index"])
def test_a_name_sent_after_the_calls_id_names_that_call(indexed: bool) -> None:
    """The id first, the name on the next delta (as pi reads it, from any
    delta): the call ran as "Tool  not found", or split in two without
    index (found by a provider audit)."""
    assembler = StreamAssembler("m")
    if indexed:
        assembler.feed(_tool_chunk(0, call_id="call_a"))
        assembler.feed(_tool_chunk(0, name="echo"))
        assembler.feed(_tool_chunk(0, args='{"text": "hi"}'))
    else:
        assembler.feed(_chunk(_call(call_id="call_a", args="")))
        assembler.feed(_chunk(_call(name="echo")))
        assembler.feed(_chunk(_call(args='{"text": "hi"}')))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, events = assembler.finish()
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [("call_a", "echo", {"text": "hi"})]
    assert errors == {}
    assert events[-1]["toolCall"]["name"] == "echo"


def test_a_name_repeated_on_every_delta_without_index_or_id_keeps_one_call() -> None:
    """Then a whole call of the same function after it is another call."""
    assembler = StreamAssembler("m")
    assembler.feed(_chunk(_call(call_id="call_a", name="echo", args='{"te')))
    assembler.feed(_chunk(_call(name="echo", args='xt": "hi"}')))
    assembler.feed(_chunk(_call(name="echo")))  # the name alone, once more: nothing new
    assembler.feed(_chunk(_call(name="echo", args='{"text": "again"}')))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    assert [(c.name, c.arguments) for c in message.tool_calls] == [
        ("echo", {"text": "hi"}),
        ("echo", {"text": "again"}),
    ]
    assert errors == {}


def test_an_answer_the_server_calls_whole_without_a_finish_reason_stopped() -> None:
    """`[DONE]` (or a completion sent whole) with no finish reason: pi maps
    a missing reason to stop. It was taken for a broken stream, retried
    five times and ended as an error (found by a provider audit)."""
    assembler = StreamAssembler("m")
    assembler.feed(_chunk({"content": "hello"}))
    with pytest.raises(StreamEndedEarly):
        assembler.finish()  # no [DONE]: the stream broke off
    assembler.done = True
    message, _, _ = assembler.finish()
    assert (message.text, message.stop_reason, message.error_message) == ("hello", "stop", None)
    calls = StreamAssembler("m")
    calls.feed(_tool_chunk(0, call_id="c", name="echo", args="{}"))
    calls.done = True
    assert calls.finish()[0].stop_reason == "toolUse"


def test_tool_calls_announced_and_none_sent_is_a_stop() -> None:
    """vLLM says `tool_calls` when its tool parser fails and sends text: pi ends it as stop."""
    assembler = StreamAssembler("m")
    assembler.feed(_chunk({"content": "<tool_call>broken"}, "tool_calls"))
    message, _, _ = assembler.finish()
    assert (message.stop_reason, message.tool_calls) == ("stop", [])


def test_a_chunk_that_is_no_object_is_passed_over() -> None:
    """`data: null` failed every attempt with an AttributeError."""
    assembler = StreamAssembler("m")
    assert assembler.feed(None) == [] and not assembler.started  # type: ignore[arg-type]
    assembler.feed(_chunk({"content": "hi"}, "stop"))
    assert assembler.finish()[0].text == "hi"


def _transcripts() -> list[list[Any]]:
    """Transcripts exercising every conversion rule, sharing message objects."""
    user, steer = UserMessage(content="go", timestamp=0), UserMessage(content="steer", timestamp=0)
    empty = UserMessage(content=[], timestamp=0)
    batch = [_turn("a", "b"), _result("a", image=True), _result("b")]
    failed = _turn("c", stop_reason="error")
    thinking = AssistantMessage(
        content=[
            ThinkingContent(thinking="hmm", thinking_signature="reasoning_content"),
            TextContent(text="x"),
        ]
    )
    return [
        [user, *batch, steer],
        [user, failed, _result("c"), *batch, empty, thinking],
        [user, batch[0], steer, batch[2], thinking],  # a call left without its result, a stray one
        [steer, *batch[1:], user, *batch],  # the same results before their call (stray), then answered
    ]


def test_converting_with_a_memo_sends_what_converting_afresh_sends() -> None:
    """The model activity keeps what each message converted to (a stored
    context is the same objects every call): the requests are the same as
    converting every message each time, and a message that is gone leaves
    nothing behind."""
    import gc

    from activities.openai_chat import ConversionMemo

    memo = ConversionMemo()
    transcripts = _transcripts()
    for _ in range(2):  # the second pass is all memo hits
        for messages in transcripts:
            assert to_openai_messages("sys", messages, memo) == to_openai_messages("sys", messages)
    assert len(memo) > 0
    del transcripts, messages
    gc.collect()
    assert len(memo) == 0


async def test_a_context_hook_that_changes_messages_in_place_is_sent_what_it_changed(tmp_path: Any) -> None:
    """With context hooks of one's own, messages are converted afresh each
    call: a hook may edit them in place (pruning old tool output), and the
    model must see the edit, not what the message said on an earlier call."""
    from aiohttp import web

    from activities.blobs import FileBlobStore
    from activities.context_store import ContextStore
    from tests.support.serving import serving

    sent: list[str] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        sent.append(body["messages"][-1]["content"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in (
            {
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}
                ]
            },
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ):
            chunk["object"] = "chat.completion.chunk"
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    calls = 0

    def edit_in_place(messages: list[Any]) -> list[Any]:
        nonlocal calls
        calls += 1
        messages[-1].content = f"edit {calls}"
        return messages

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    request = LlmRequest(model="m", messages=[UserMessage(content="hi", timestamp=0)], turn=1)
    async with serving(app) as url:
        for hook in (edit_in_place, None):
            store = ContextStore(FileBlobStore(tmp_path, durable=False))  # the memo's case
            llm = LlmActivities(
                api_key="k", base_url=f"{url}/v1", transform_context=hook, context_store=store
            )
            for _ in range(2):
                await ActivityEnvironment().run(llm.stream_assistant_response, request)
    # The default hooks leave the message as the last edit made it.
    assert sent == ["edit 1", "edit 2", "edit 2", "edit 2"]


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "86400"}, 300.0),  # capped
        ({"retry-after": "soon"}, None),
        ({"retry-after": "NaN"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after": "Mon, 99 Foo 2026 99:99:99 GMT"}, None),
        ({"retry-after": "Thu, 01 Jan 1970 00:00:00 -0000"}, 0.0),  # a date past, without a zone
        ({}, None),
    ],
)
def test_a_429_is_retryable_whatever_its_retry_after_says(
    headers: dict[str, str], delay: float | None
) -> None:
    """A proxy's odd Retry-After leaves the delay to the activity's backoff:
    the failure is still the server's 429, not a date-parsing error."""
    response = httpx2.Response(429, headers=headers, request=httpx2.Request("POST", "http://model/v1"))
    err = openai.RateLimitError("slow down", response=response, body=None)
    failure = _classify(err, (), streaming=False)
    assert isinstance(failure, ApplicationError) and failure.type == "ModelHttp429"
    assert not failure.non_retryable and "The model server answered 429" in failure.message
    got = failure.next_retry_delay
    assert (got.total_seconds() if got is not None else None) == delay


# --- as pi 0.73.1's openai-completions provider reads and writes (a pi parity audit) ---


def _call_with_arguments(arguments: str) -> tuple[dict[str, Any], dict[str, str]]:
    assembler = StreamAssembler("m")
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    assembler.feed(_chunk({"tool_calls": [call]}))
    assembler.feed(_chunk({}, "tool_calls"))
    message, errors, _ = assembler.finish()
    return message.tool_calls[0].arguments, errors


def test_arguments_with_raw_line_breaks_or_single_backslashes_are_repaired_as_pi_does() -> None:
    """Models write multi-line strings, regexes and Windows paths into the
    JSON unescaped: pi repairs them (``repairJson``); the port made each an
    error result ("Invalid control character", "Invalid \\escape")."""
    assert _call_with_arguments('{"cmd": "echo a\nb\tc"}') == ({"cmd": "echo a\nb\tc"}, {})
    assert _call_with_arguments(r'{"pattern": "\d+\.\w*", "path": "C:\Users\me"}') == (
        {"pattern": r"\d+\.\w*", "path": r"C:\Users\me"},
        {},
    )
    assert _call_with_arguments(r'{"a": "\u00e9\"\\"}') == ({"a": 'é"\\'}, {})
    # A `u` without four hex digits after it is a backslash to keep, too (pi's would fail).
    assert _call_with_arguments(r'{"path": "C:\users\me"}') == ({"path": r"C:\users\me"}, {})
    # Cut off mid-way: not completed (a call with half its arguments must not run).
    arguments, errors = _call_with_arguments('{"path": "notes.md", "content": "first li')
    assert arguments == {} and "Unterminated string" in errors["c1"]


def test_a_finish_reason_that_is_no_answer_ends_as_an_error_and_its_calls_do_not_run() -> None:
    """As pi maps them: ``end`` is ``stop`` (the port made it an error that
    ended the run); ``content_filter`` with tool calls is an error whose
    calls are dropped (the port ran the flagged calls)."""
    assembler = StreamAssembler("m")
    assembler.feed(_chunk({"content": "done"}))
    assembler.feed(_chunk({}, "end"))
    message, _, _ = assembler.finish()
    assert message.stop_reason == "stop" and message.error_message is None

    assembler = StreamAssembler("m")
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    assembler.feed(_chunk({"content": "let me", "tool_calls": [call]}))
    assembler.feed(_chunk({}, "content_filter"))
    message, errors, events = assembler.finish()
    assert message.stop_reason == "error" and message.tool_calls == [] and errors == {}
    assert message.error_message == "The model stopped with finish_reason='content_filter'."
    assert message.text == "let me"
    assert not any(event["type"] == "toolcall_end" for event in events)


def test_usage_is_read_as_pi_reads_it() -> None:
    """DeepSeek's ``prompt_cache_hit_tokens``, cache writes (which some
    servers also count as cached), a total from the parts, and usage sent
    inside the choice (Moonshot): the port read none of these."""
    deepseek = usage_from_openai(
        "m",
        {"prompt_tokens": 100, "completion_tokens": 10, "prompt_cache_hit_tokens": 40, "total_tokens": 999},
    )
    assert (deepseek.input, deepseek.cache_read, deepseek.total_tokens) == (60, 40, 110)
    details = {"cached_tokens": 50, "cache_write_tokens": 20}
    written = usage_from_openai(
        "m", {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": details}
    )
    assert (written.input, written.cache_read, written.cache_write, written.total_tokens) == (50, 30, 20, 110)

    assembler = StreamAssembler("m")
    assembler.feed(_chunk({"content": "hi"}))
    chunk = _chunk({}, "stop")
    chunk["choices"][0]["usage"] = {"prompt_tokens": 7, "completion_tokens": 2}
    assembler.feed(chunk)
    message, _, _ = assembler.finish()
    assert (message.usage.input, message.usage.output, message.usage.total_tokens) == (7, 2, 9)


def test_a_tool_result_of_only_images_says_they_follow() -> None:
    """pi sends "(see attached image)"; the port sent an empty tool message."""
    result = ToolResultMessage(
        tool_call_id="a", tool_name="picture", content=[ImageContent(data=PIXEL_PNG, mime_type="image/png")]
    )
    sent = to_openai_messages(None, [UserMessage(content="go", timestamp=0), _turn("a"), result])
    assert sent[2] == {"role": "tool", "tool_call_id": "a", "content": "(see attached image)"}
    assert sent[3]["role"] == "user" and sent[3]["content"][1]["type"] == "image_url"


# --- found untested by a mutation audit of the model call (twenty-second session) ---


def _turn_of(*calls: ToolCall) -> AssistantMessage:
    return AssistantMessage.model_validate({"content": list(calls), "stopReason": "toolUse", "timestamp": 0})


GO = UserMessage(content="go", timestamp=0)


# --- finish reasons -------------------------------------------------------


def test_the_legacy_function_call_finish_reason_runs_the_call() -> None:
    """Mutant: `"function_call": "toolUse",` dropped from _FINISH_REASONS.
    A server on the legacy functions API ends with ``function_call``: its
    call must run, not end the run as an error."""
    assembler = StreamAssembler("m")
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    assembler.feed(_chunk({"tool_calls": [call]}))
    assembler.feed(_chunk({}, "function_call"))
    message, errors, _ = assembler.finish()
    assert message.stop_reason == "toolUse" and message.error_message is None
    assert [c.id for c in message.tool_calls] == ["c1"] and errors == {}


def test_the_last_finish_reason_sent_is_the_one_taken() -> None:
    """Mutant: only the first finish_reason kept. A stream that sends a
    finish reason and then another ends as the last one says."""
    assembler = StreamAssembler("m")
    assembler.feed(_chunk({"content": "a long answer"}, "stop"))
    assembler.feed(_chunk({}, "length"))
    message, _, _ = assembler.finish()
    assert message.stop_reason == "length"


# --- tool-call arguments --------------------------------------------------


def test_blank_arguments_are_no_arguments() -> None:
    """Mutant: ``if raw.strip()`` -> ``if raw``. A server that streams
    whitespace (or a newline) as the arguments of a call with no
    parameters: the call runs with ``{}``, it is no error result."""
    assert _call_with_arguments("  \n") == ({}, {})


def test_arguments_that_are_json_but_no_object_are_an_error() -> None:
    """Mutant: the ``isinstance(parsed, dict)`` check dropped. A tool
    receives keyword arguments: a list, a string or a number is an error the
    model sees, never arguments."""
    for raw in ("[1, 2]", '"text"', "3"):
        arguments, errors = _call_with_arguments(raw)
        assert arguments == {}
        assert "expected a JSON object" in errors["c1"]


def test_arguments_nested_to_the_limit_are_taken_one_deeper_refused() -> None:
    """Mutant: ``nesting_depth(parsed) > MAX_NESTING`` -> ``>=``."""
    at_limit = json.dumps(_nested(MAX_NESTING))
    arguments, errors = _call_with_arguments(at_limit)
    assert errors == {} and arguments == _nested(MAX_NESTING)
    arguments, errors = _call_with_arguments(json.dumps(_nested(MAX_NESTING + 1)))
    assert arguments == {} and f"nested deeper than {MAX_NESTING} levels" in errors["c1"]


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_an_argument_error_quotes_at_most_500_characters_of_what_was_received() -> None:
    """Mutant: ``raw[:500]`` -> ``raw``. The error goes to the model and
    into the history: megabytes of broken arguments must not go with it."""
    raw = '{"text": "' + "x" * 100_000  # cut off: not JSON
    _, errors = _call_with_arguments(raw)
    assert errors["c1"].endswith(f"(received: {raw[:500]})")
    assert len(errors["c1"]) < 700


def test_an_escaped_slash_survives_the_repair() -> None:
    """Mutant: ``/`` dropped from _VALID_ESCAPES. Arguments that need
    repair (a raw line break) and hold ``\\/`` (JSON-escaped URLs, as many
    models write them) keep ``/``, not a backslash before it."""
    arguments, errors = _call_with_arguments('{"cmd": "curl a\nb", "url": "https:\\/\\/example.com\\/x"}')
    assert errors == {}
    assert arguments == {"cmd": "curl a\nb", "url": "https://example.com/x"}


# --- what is sent to the model -------------------------------------------


def test_a_tool_results_text_parts_are_sent_one_per_line() -> None:
    """Mutant: ``"\\n".join`` -> ``"".join`` in _tool_parts."""
    result = ToolResultMessage(
        tool_call_id="a",
        tool_name="echo",
        content=[TextContent(text="first line"), TextContent(text="second line")],
    )
    sent = to_openai_messages(None, [GO, _turn_of(ToolCall(id="a", name="echo")), result])
    assert sent[2] == {"role": "tool", "tool_call_id": "a", "content": "first line\nsecond line"}


def test_a_call_id_of_exactly_40_characters_is_sent_as_it_is() -> None:
    """Mutant: ``len(call_id) <= MAX_CALL_ID`` -> ``<``. OpenAI takes 40
    characters: such an id is sent unchanged (and pairs with its result)."""
    call_id = "call_" + "x" * 35
    assert len(call_id) == 40
    result = ToolResultMessage(tool_call_id=call_id, tool_name="echo", content=[TextContent(text="ok")])
    sent = to_openai_messages(None, [GO, _turn_of(ToolCall(id=call_id, name="echo")), result])
    assert sent[1]["tool_calls"][0]["id"] == call_id and sent[2]["tool_call_id"] == call_id


def test_a_made_up_tool_name_is_cut_to_64_characters() -> None:
    """Mutant: ``[:64]`` -> ``[:65]``. OpenAI refuses a function name over
    64 characters (400) on this and every later call with it in the context."""
    result = ToolResultMessage(tool_call_id="a", tool_name="x", content=[TextContent(text="not found")])
    sent = to_openai_messages(None, [GO, _turn_of(ToolCall(id="a", name="n" * 100)), result])
    assert sent[1]["tool_calls"][0]["function"]["name"] == "n" * 64


def test_reasoning_in_two_blocks_goes_back_one_block_per_line() -> None:
    """Mutant: the reasoning blocks joined with ``""`` instead of ``"\\n"``."""
    message = AssistantMessage(
        content=[
            ThinkingContent(thinking="first thought", thinking_signature="reasoning_content"),
            TextContent(text="so"),
            ThinkingContent(thinking="second thought", thinking_signature="reasoning_content"),
        ],
        stop_reason="stop",
        timestamp=0,
    )
    sent = to_openai_messages(None, [GO, message])[1]
    assert sent["reasoning_content"] == "first thought\nsecond thought"


# --- a whole (not streamed) answer ---------------------------------------


def test_a_whole_answers_calls_without_index_or_id_stay_apart() -> None:
    """Mutant: ``call.get("index", n)`` -> ``call.get("index", 0)`` in
    completion_as_chunk. A non-streaming server that numbers nothing: two
    calls of one function are two calls, not one with ``{..}{..}``."""
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "echo", "arguments": '{"text": "a"}'}},
                        {"type": "function", "function": {"name": "echo", "arguments": '{"text": "b"}'}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    assembler = StreamAssembler("m")
    assembler.feed(completion_as_chunk(completion))
    message, errors, _ = assembler.finish()
    assert [c.arguments for c in message.tool_calls] == [{"text": "a"}, {"text": "b"}]
    assert errors == {}


# --- usage and cost -------------------------------------------------------


def test_an_empty_usage_after_the_real_one_does_not_erase_it() -> None:
    """Mutant: ``and chunk["usage"]`` dropped. A server that sends
    ``"usage": {}`` on a chunk after the one with the counts."""
    assembler = StreamAssembler("m")
    usage_chunk = _chunk({"content": "hi"}, "stop")
    usage_chunk["usage"] = {"prompt_tokens": 7, "completion_tokens": 2}
    assembler.feed(usage_chunk)
    assembler.feed({"choices": [], "usage": {}})
    message, _, _ = assembler.finish()
    assert (message.usage.input, message.usage.output) == (7, 2)


def test_cache_writes_cost_as_input_and_never_exceed_the_prompt() -> None:
    """Mutants: ``cache_write=written * price_in / 1e6`` -> ``0.0``, and
    ``written = min(prompt, ...)`` -> uncapped."""
    usage = usage_from_openai(
        "gpt-4o",
        {
            "prompt_tokens": 1_000_000,
            "completion_tokens": 0,
            "prompt_tokens_details": {"cache_write_tokens": 400_000},
        },
    )
    assert usage.cache_write == 400_000 and usage.input == 600_000
    assert usage.cost.cache_write == pytest.approx(0.4 * 2.50)
    assert usage.cost.total == pytest.approx(2.50)
    odd = usage_from_openai(
        "m",
        {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cache_write_tokens": 50}},
    )
    assert (odd.input, odd.cache_read, odd.cache_write, odd.total_tokens) == (0, 0, 10, 11)


@pytest.mark.parametrize(
    ("model", "per_million_in"),
    [
        ("gpt-4o-mini", 0.15),  # not gpt-4o's price
        ("gpt-4.1-nano", 0.10),  # not gpt-4.1's
        ("gpt-5-mini", 0.25),  # not gpt-5's
        ("openai/gpt-4o-mini", 0.15),  # a router's provider prefix
        ("o3", 2.00),
        ("unknown-model", 0.0),
    ],
)
def test_a_model_is_priced_by_its_longest_known_name(model: str, per_million_in: float) -> None:
    """Mutants: the prefixes tried shortest first (gpt-4o-mini priced as
    gpt-4o), and the ``provider/`` prefix not stripped (OpenRouter's
    ``openai/gpt-4o-mini`` costing nothing)."""
    usage = usage_from_openai(model, {"prompt_tokens": 1_000_000, "completion_tokens": 0})
    assert usage.cost.input == pytest.approx(per_million_in)


# --- more of what is sent -------------------------------------------------


def test_an_aborted_turn_is_left_out_with_its_results() -> None:
    """Mutant: only ``error`` turns left out, not ``aborted`` ones: their
    partial text (and calls cut off mid-way) would be sent back as the
    model's own words."""
    aborted = AssistantMessage.model_validate(
        {
            "content": [TextContent(text="I will delete"), ToolCall(id="a", name="bash")],
            "stopReason": "aborted",
            "timestamp": 0,
        }
    )
    result = ToolResultMessage(tool_call_id="a", tool_name="bash", content=[TextContent(text="aborted")])
    assert to_openai_messages(None, [GO, aborted, result, UserMessage(content="next", timestamp=0)]) == [
        {"role": "user", "content": "go"},
        {"role": "user", "content": "next"},
    ]


def test_a_calls_arguments_go_back_as_json() -> None:
    """Mutant: ``json.dumps(call.arguments)`` -> ``str(...)`` (a Python
    repr, which OpenAI refuses and other servers misread)."""
    call = ToolCall(id="a", name="echo", arguments={"text": "it's", "n": 1, "ok": True, "none": None})
    result = ToolResultMessage(tool_call_id="a", tool_name="echo", content=[TextContent(text="ok")])
    sent = to_openai_messages(None, [GO, _turn_of(call), result])
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == call.arguments


@pytest.mark.parametrize(
    ("attempt", "failure", "local", "expected"),
    [
        (1, ApplicationError("The model server answered 500: x", type="ModelHttp500"), False, True),
        (4, ApplicationError("The model server answered 500: x", type="ModelHttp500"), False, True),
        (5, ApplicationError("The model server answered 500: x", type="ModelHttp500"), False, False),
        (1, ApplicationError("answered 400", type="ModelHttp400", non_retryable=True), False, False),
        (1, ApplicationError("refused by the policy", type="Refused"), False, False),
        (1, ApplicationError("The model server answered 500: x", type="ModelHttp500"), True, False),
    ],
    ids=["first", "fourth", "last", "non-retryable", "policy-refuses-type", "local"],
)
def test_a_failing_attempt_announces_a_retry_only_when_temporal_will_make_one(
    attempt: int, failure: ApplicationError, local: bool, expected: bool
) -> None:
    """``message_retry`` goes out as the attempt fails only when another
    attempt follows: not after the last one (its error ends the message),
    nor after a failure the error's flag or the policy's error types keep
    from being retried, nor from a local activity (its retries are the
    workflow task's)."""
    policy = RetryPolicy(maximum_attempts=5, non_retryable_error_types=["Refused"])
    info = replace(ActivityEnvironment.default_info(), attempt=attempt, retry_policy=policy, is_local=local)
    assert will_retry(failure, info) is expected


def test_a_retry_event_left_over_or_undelivered_is_not_counted_as_said() -> None:
    """The next attempt skips its ``message_retry`` only when the failing
    attempt's reached the conversation: not when it stayed in the
    publisher's tail (no budget, signals refused) nor when its signal failed."""
    notice = _RetryNotice()
    assert not notice.delivered()  # nothing published
    notice.publisher = ActivityEventPublisher(100)
    notice.published = True
    assert notice.delivered()
    retry = {"type": "message_retry", "attempt": 2, "reason": "x"}
    notice.publisher.tail = [retry]
    assert not notice.delivered()
    notice.publisher.tail, notice.publisher.undelivered = [], [retry]
    assert not notice.delivered()
