"""pi's loop scenarios against ``workflows/loop.py`` itself, with in-memory
fakes: no server, no worker (the whole group runs in well under a second).
The conformance tests in test_loop.py prove the same on the real wiring."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_core import to_json
from temporalio.worker._workflow_instance import _WorkflowBeingEvictedError

from tests.support.fake_loop import FakeAgent, calls, say, user
from workflows.arguments import MAX_NESTING, ToolArgumentsError, validate_tool_arguments
from workflows.calls import tool_summary
from workflows.hooks import (
    AgentHooks,
    BlockToolCall,
    RequireApproval,
    ToolCallContext,
    ToolResultOverride,
    TurnContext,
    failure_text,
)
from workflows.loop import TOOL_CALLS_PER_PART, ApprovalDecision, PreparedToolCall, run_agent_loop, run_loop
from workflows.models import TextContent, ToolDeclaration, ToolOutcome, text_result


async def echo(args: dict[str, Any]) -> str:
    await asyncio.sleep(args.get("delay", 0))
    return f"echo: {args['text']}"


def agent(*answers: Any) -> FakeAgent:
    fake = FakeAgent(answers=list(answers))
    fake.tool("echo", echo)
    return fake


async def run(fake: FakeAgent, prompt: str = "go") -> list[Any]:
    context = fake.context()
    await run_agent_loop([user(prompt)], context, fake.config())
    return context.messages


def roles(messages: list[Any]) -> list[str]:
    out = []
    for m in messages:
        role = m.role
        if role == "toolResult":
            role += f":{m.tool_call_id}"
        elif role == "assistant":
            role += f":{m.stop_reason}"
        out.append(role)
    return out


async def test_a_plain_answer_emits_one_turn() -> None:
    fake = agent(say("hello"))
    await run(fake)
    assert fake.outline() == [
        "agent_start",
        "turn_start",
        "message_start:user",
        "message_end:user",
        "message_start:assistant",
        "message_end:assistant:stop",
        "turn_end",
        "agent_end",
    ]
    assert [m["role"] for m in fake.events[-1]["messages"]] == ["user", "assistant"]


async def test_tool_results_feed_the_next_turn() -> None:
    fake = agent(calls(("c1", "echo", {"text": "x"})), say("done"))
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:toolUse", "toolResult:c1", "assistant:stop"]
    assert messages[2].content[0].text == "echo: x"
    assert roles(fake.model_contexts[1]) == ["user", "assistant:toolUse", "toolResult:c1"]
    assert fake.outline().count("turn_start") == 2


async def test_parallel_tools_end_in_completion_order_results_in_source_order() -> None:
    fake = agent(
        calls(("slow", "echo", {"text": "a", "delay": 0.05}), ("fast", "echo", {"text": "b"})), say("ok")
    )
    await run(fake)
    lines = fake.outline()
    part = lines[lines.index("tool_execution_start:slow") : lines.index("turn_end")]
    assert part == [
        "tool_execution_start:slow",
        "tool_execution_start:fast",
        "tool_execution_end:fast",
        "tool_execution_end:slow",
        "message_start:toolResult:slow",
        "message_end:toolResult:slow",
        "message_start:toolResult:fast",
        "message_end:toolResult:fast",
    ]


async def test_one_sequential_tool_makes_the_batch_sequential() -> None:
    fake = agent(calls(("s1", "echo", {"text": "a", "delay": 0.02}), ("s2", "seq", {"text": "b"})), say("ok"))
    fake.tool("seq", echo, execution_mode="sequential")
    await run(fake)
    lines = fake.outline()
    assert lines.index("message_end:toolResult:s1") < lines.index("tool_execution_start:s2")


async def test_steering_is_injected_after_the_whole_batch_before_the_next_call() -> None:
    fake = agent(calls(("t1", "echo", {"text": "a"}), ("t2", "echo", {"text": "b"})), say("steered"))
    fake.steering.append(user("change course"))  # arrives while tools run (polled after the batch)
    context = fake.context()
    await run_agent_loop([user("go")], context, fake.config(), skip_initial_steering=True)
    assert roles(context.messages) == [
        "user",
        "assistant:toolUse",
        "toolResult:t1",
        "toolResult:t2",
        "user",
        "assistant:stop",
    ]
    steer_start = next(e for e in fake.events if e["type"] == "message_start" and e.get("queue"))
    assert steer_start["queue"] == "steering"


async def test_follow_up_runs_only_when_the_agent_would_stop() -> None:
    fake = agent(say("first"), say("second"))
    fake.follow_up.append(user("and then?"))
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:stop", "user", "assistant:stop"]
    follow = [e for e in fake.events if e["type"] == "message_start" and e.get("queue") == "followUp"]
    assert len(follow) == 1
    assert fake.outline().count("agent_end") == 1


async def test_terminate_only_when_every_result_says_so() -> None:
    async def finish(args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(content=text_result("done"), terminate=True)

    fake = agent(calls(("f1", "finish", {"text": "x"})))
    fake.tool("finish", finish)
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:toolUse", "toolResult:f1"]
    # The event carries the whole result, as pi's: a subscriber sees why the run stopped.
    end = next(e for e in fake.events if e["type"] == "tool_execution_end")
    assert end["result"] == {"content": [{"type": "text", "text": "done"}], "terminate": True}
    assert "details" not in messages[-1].model_dump(), "no details in the event, none in the message"

    mixed = agent(calls(("f1", "finish", {"text": "x"}), ("e1", "echo", {"text": "y"})), say("more"))
    mixed.tool("finish", finish)
    assert roles(await run(mixed))[-1] == "assistant:stop"


async def test_errors_and_aborts_end_the_run_at_once() -> None:
    fake = agent(RuntimeError("model down"))
    fake.follow_up.append(user("queued"))
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:error"]
    assert fake.outline()[-2:] == ["turn_end", "agent_end"]
    assert fake.follow_up, "queued messages stay queued after an error"


async def test_abort_during_tools_ends_without_calling_the_model_again() -> None:
    fake = agent(
        calls(("a1", "echo", {"text": "x", "delay": 0.05}), ("a2", "echo", {"text": "y"})), say("never")
    )

    async def abort_soon() -> None:
        await asyncio.sleep(0.01)
        fake.aborted = True

    context = fake.context()
    await asyncio.gather(run_agent_loop([user("go")], context, fake.config()), abort_soon())
    assert roles(context.messages)[-1] == "assistant:aborted"
    assert len(fake.model_contexts) == 1
    results = [m for m in context.messages if m.role == "toolResult"]
    assert {r.tool_call_id for r in results} == {"a1", "a2"}, "no tool call without a result"


async def test_after_an_abort_every_unfinished_call_is_aborted_whatever_else_is_wrong_with_it() -> None:
    """SPEC 6: every unfinished call gets "Tool execution aborted". In
    sequential mode the calls after the running one are prepared after the
    abort; an unknown tool or arguments that are not JSON got their own
    error ("Tool nope not found") instead (found by a contract audit)."""
    fake = agent(
        calls(
            ("a1", "stop", {"text": "x"}),
            ("u1", "nope", {}),
            ("j1", "echo", {}),
            ("v1", "echo", {"wrong": 1}),
            ("e1", "echo", {"text": "x"}),
        ),
        say("never"),
    )
    fake.tool_execution = "sequential"

    async def abort_while_running(args: dict[str, Any]) -> str:
        fake.aborted = True
        return "stopped"

    fake.tool("stop", abort_while_running)
    context = fake.context()
    config = fake.config()
    original = config.stream_assistant_response

    async def with_parse_error(ctx: Any) -> Any:
        answer = await original(ctx)
        answer.argument_errors = {"j1": "Unterminated string"}
        return answer

    config.stream_assistant_response = with_parse_error
    await run_agent_loop([user("go")], context, config)
    results = {m.tool_call_id: m.content[0].text for m in context.messages if m.role == "toolResult"}
    assert results == {
        "a1": "stopped",
        "u1": "Tool execution aborted",
        "j1": "Tool execution aborted",
        "v1": "Tool execution aborted",
        "e1": "Tool execution aborted",
    }
    assert roles(context.messages)[-1] == "assistant:aborted"
    assert len(fake.model_contexts) == 1


async def test_unknown_tool_bad_json_and_invalid_arguments_are_immediate_errors() -> None:
    fake = agent(calls(("u1", "nope", {}), ("v1", "echo", {"wrong": 1}), ("j1", "echo", {})), say("fix"))
    context = fake.context()
    config = fake.config()

    original = config.stream_assistant_response

    async def with_parse_error(ctx: Any) -> Any:
        answer = await original(ctx)
        answer.argument_errors = {"j1": "Unterminated string"} if answer.message.tool_calls else {}
        return answer

    config.stream_assistant_response = with_parse_error
    await run_agent_loop([user("go")], context, config)
    results = {m.tool_call_id: m for m in context.messages if m.role == "toolResult"}
    assert results["u1"].content[0].text == "Tool nope not found"
    assert results["v1"].content[0].text.startswith('Validation failed for tool "echo"')
    assert "text: required property missing" in results["v1"].content[0].text
    assert "not valid JSON" in results["j1"].content[0].text
    assert all(r.is_error for r in results.values())
    lines = fake.outline()
    # Immediate results end during preparation, before the batch runs.
    assert lines.index("tool_execution_end:u1") < lines.index("tool_execution_start:v1")


async def test_arguments_are_coerced_as_pi_does_and_defaults_filled() -> None:
    """pi coerces scalars; filling in the schema's defaults is ours (pi's tool sees none)."""
    seen: list[dict[str, Any]] = []

    async def record(args: dict[str, Any]) -> str:
        seen.append(args)
        return "ok"

    fake = agent(calls(("c1", "rec", {"text": 5}), ("c2", "rec", {"text": "x", "delay": "0.5"})), say("ok"))
    fake.tool("rec", record)
    await run(fake)
    assert seen == [{"text": "5", "delay": 0}, {"text": "x", "delay": 0.5}]


async def test_length_truncated_calls_are_refused_and_the_loop_goes_on() -> None:
    fake = agent(calls(("l1", "echo", {"text": "x"}), stop_reason="length"), say("retrying"))
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:length", "toolResult:l1", "assistant:stop"]
    assert "token limit" in messages[2].content[0].text


async def test_stop_after_turn_skips_both_queues() -> None:
    fake = agent(calls(("c1", "steer", {"text": "x"})), say("never"))

    async def steer(args: dict[str, Any]) -> str:
        fake.steering.append(user("s"))  # arrives while the tool runs
        return "ok"

    fake.tool("steer", steer)
    fake.stop_after = lambda: True
    fake.follow_up.append(user("f"))
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:toolUse", "toolResult:c1"]
    assert fake.steering and fake.follow_up


class Guard(AgentHooks):
    def before_tool_call(self, context: ToolCallContext) -> BlockToolCall | None:
        if context.args["text"] == "forbidden":
            return BlockToolCall("not here")
        if context.args["text"] == "raise":
            raise RuntimeError("before hook failed")
        return None

    async def after_tool_call(
        self, context: ToolCallContext, outcome: ToolOutcome
    ) -> ToolResultOverride | None:
        if context.args["text"] == "secret":
            return ToolResultOverride(content="redacted", details={"redacted": True})
        if context.args["text"] == "boom":
            raise ValueError("after hook failed")
        if context.args["text"] == "odd":
            return "not an override"  # type: ignore[return-value]
        return None


async def test_hooks_block_rewrite_and_their_failures_become_error_results() -> None:
    fake = agent(
        calls(
            ("b1", "echo", {"text": "forbidden"}),
            ("b2", "echo", {"text": "raise"}),
            ("s1", "echo", {"text": "secret"}),
            ("x1", "echo", {"text": "boom"}),
            ("o1", "echo", {"text": "odd"}),
        ),
        say("ok"),
    )
    fake.hooks = Guard()
    messages = await run(fake)
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["b1"].is_error and results["b1"].content[0].text == "not here"
    assert results["b2"].is_error and results["b2"].content[0].text == "before hook failed"
    assert not results["s1"].is_error and results["s1"].content[0].text == "redacted"
    assert results["s1"].details == {"redacted": True}
    assert results["x1"].is_error and results["x1"].content[0].text == "after hook failed"
    assert results["o1"].is_error and "expected ToolResultOverride" in results["o1"].content[0].text
    assert roles(messages)[-1] == "assistant:stop"


async def test_a_failing_should_stop_hook_ends_the_run_with_an_error() -> None:
    class Broken(AgentHooks):
        def should_stop_after_turn(self, context: TurnContext) -> bool:
            raise KeyError("budget")

    fake = agent(say("hi"), say("never"))
    fake.hooks = Broken()
    fake.follow_up.append(user("later"))
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:stop", "assistant:error"]
    assert "should_stop_after_turn failed" in (messages[-1].error_message or "")
    # pi's handleRunFailure: the failure message has a turn_end of its own,
    # where a client reads the error (pi's state takes errorMessage there).
    assert fake.outline()[-5:] == [
        "turn_end",
        "message_start:assistant",
        "message_end:assistant:error",
        "turn_end",
        "agent_end",
    ]
    last_turn_end = [e for e in fake.events if e["type"] == "turn_end"][-1]
    assert last_turn_end["message"]["stopReason"] == "error" and last_turn_end["toolResults"] == []
    assert "modelTurn" not in last_turn_end

    # A run recorded before (stream-events-as-pi not in force) replays as it
    # ran, without that turn_end: the stream keeps the offsets its readers hold.
    before = agent(say("hi"))
    before.hooks = Broken()
    context = before.context()
    await run_agent_loop([user("go")], context, replace(before.config(), failure_turn_end=lambda: False))
    assert before.outline()[-3:] == ["message_start:assistant", "message_end:assistant:error", "agent_end"]


async def test_approval_is_asked_in_the_batch_and_a_rejection_is_an_error_result() -> None:
    class Ask(AgentHooks):
        def before_tool_call(self, context: ToolCallContext) -> RequireApproval | None:
            return RequireApproval("risky") if context.tool_call.id == "r1" else None

    fake = agent(calls(("r1", "echo", {"text": "a"}), ("ok1", "echo", {"text": "b"})), say("ok"))
    fake.hooks = Ask()
    fake.approvals["r1"] = ApprovalDecision(False, "Tool call echo was rejected: no")
    messages = await run(fake)
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["r1"].is_error and results["r1"].content[0].text == "Tool call echo was rejected: no"
    assert not results["ok1"].is_error
    assert [e["toolCallId"] for e in fake.events if e["type"] == "approval_asked"] == ["r1"]


async def test_resuming_at_a_turn_boundary_continues_the_same_run() -> None:
    fake = agent(say("after the switch"))
    messages = [user("go"), calls(("c1", "echo", {"text": "x"})), *[]]
    context = fake.context(messages)
    context.run.started_at_message = 0
    await run_loop(context, fake.config(), pending=[], first_turn=False, has_more_tool_calls=True)
    assert fake.outline()[0] == "turn_start"
    assert [m["role"] for m in fake.events[-1]["messages"]] == ["user", "assistant", "assistant"]


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
async def test_every_tool_call_gets_exactly_one_result(mode: str) -> None:
    fake = agent(calls(*[(f"c{i}", "echo", {"text": str(i)}) for i in range(50)]), say("ok"))
    fake.tool_execution = mode
    messages = await run(fake)
    assert [m.tool_call_id for m in messages if m.role == "toolResult"] == [f"c{i}" for i in range(50)]


async def test_an_abort_during_the_last_turns_tools_still_ends_the_run_aborted() -> None:
    """SPEC 6: an abort during tools ends the run with an aborted message,
    also when the turn would stop the run anyway (stop_after_turn, maxTurns,
    a budget): a client reads `aborted`, not a normal end."""

    def aborted_during_tools() -> FakeAgent:
        fake = agent(calls(("a1", "echo", {"text": "x", "delay": 0.05})), say("never"))
        fake.stop_after = lambda: True

        async def abort_while_running(args: dict[str, Any]) -> str:
            fake.aborted = True
            return "x"

        fake.tool("echo", abort_while_running)
        return fake

    fake = aborted_during_tools()
    messages = await run(fake)
    assert roles(messages)[-1] == "assistant:aborted"
    assert messages[-1].error_message == "Request was aborted"
    assert len(fake.model_contexts) == 1
    assert fake.outline()[-6:] == [
        "turn_end",
        "turn_start",
        "message_start:assistant",
        "message_end:assistant:aborted",
        "turn_end",
        "agent_end",
    ]

    # A run recorded before (abort-over-stop not in force) replays as it ran.
    before = aborted_during_tools()
    context = before.context()
    await run_agent_loop([user("go")], context, replace(before.config(), abort_over_stop=lambda: False))
    assert roles(context.messages)[-1] == "toolResult:a1"
    assert before.outline()[-2:] == ["turn_end", "agent_end"]


@pytest.mark.parametrize("mode", ["parallel", "sequential", "length"])
async def test_a_long_batch_is_worked_on_in_parts_with_the_same_events(mode: str) -> None:
    """The workflow ends its task between parts of a batch of thousands of
    calls (one task past ~10,000 outlasted the SDK's deadlock check). The
    pauses come after every TOOL_CALLS_PER_PART preparations, starts and
    results, and change nothing else: the events are those of a loop that
    never pauses."""
    n = 2 * TOOL_CALLS_PER_PART + 7
    answer = calls(
        *[(f"c{i}", "echo", {"text": str(i)}) for i in range(n)],
        stop_reason="length" if mode == "length" else "toolUse",
    )

    async def run_batch(pausing: bool) -> list[str]:
        fake = agent(answer, say("done"))
        fake.tool_execution = "sequential" if mode == "sequential" else "parallel"

        async def pause() -> None:
            fake.events.append({"type": "pause"})
            await asyncio.sleep(0)

        config = replace(fake.config(), pause_between_parts=pause if pausing else lambda: None)
        context = fake.context()
        await run_agent_loop([user("go")], context, config)
        assert len([m for m in context.messages if m.role == "toolResult"]) == n
        return [e["type"] for e in fake.events]

    paused, plain = await run_batch(True), await run_batch(False)
    assert [t for t in paused if t != "pause"] == plain
    counts: list[tuple[int, int]] = []  # (tool starts, result message ends) before each pause
    starts = ends = 0
    for kind in paused:
        starts += kind == "tool_execution_start"
        ends += kind == "message_end"
        if kind == "pause":
            counts.append((starts, ends - 1))  # the prompt's message_end
    part = TOOL_CALLS_PER_PART
    if mode == "sequential":  # each call starts and gets its result before the next
        assert counts == [(part, part + 1), (2 * part, 2 * part + 1)]  # and the call's assistant message
    elif mode == "length":  # every call is refused, then the results land in source order
        assert counts == [(part, 1), (2 * part, 1), (n, part + 1), (n, 2 * part + 1)]
    else:  # every call is prepared, then started, then the results land in source order
        assert counts == [(part, 1), (2 * part, 1), (n, 1), (n, 1), (n, part + 1), (n, 2 * part + 1)]


async def test_a_hook_raising_cancelled_error_is_a_hook_failure_not_the_end_of_the_conversation() -> None:
    """asyncio.CancelledError is no Exception: a hook that raised it (or let
    one from its own awaits escape) went past every handler, and the
    workflow failed as cancelled. It is now the hook's failure like any."""

    class Cancelling(AgentHooks):
        async def before_tool_call(self, context: ToolCallContext) -> None:
            if context.tool_call.id == "b":
                raise asyncio.CancelledError

        def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> None:
            if context.tool_call.id == "a":
                raise asyncio.CancelledError("after hook cancelled")

        def should_stop_after_turn(self, context: TurnContext) -> bool:
            if context.message.text == "stop?":
                raise asyncio.CancelledError
            return False

    fake = agent(calls(("a", "echo", {"text": "1"}), ("b", "echo", {"text": "2"})), say("stop?"))
    fake.hooks = Cancelling()
    messages = await run(fake)
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["a"].is_error and results["a"].content[0].text == "after hook cancelled"
    assert results["b"].is_error and results["b"].content[0].text == "CancelledError"
    assert messages[-1].stop_reason == "error"
    assert messages[-1].error_message == "should_stop_after_turn failed: CancelledError"


class OwnBaseError(BaseException):
    """A user's own BaseException (not an Exception)."""


@pytest.mark.parametrize(
    ("raised", "text"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (GeneratorExit("closed"), "GeneratorExit: closed"),
        (OwnBaseError("mine"), "OwnBaseError: mine"),
        (KeyError("no such key"), "no such key"),  # not Python's quoted "'no such key'"
    ],
    ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit", "own", "KeyError"],
)
async def test_a_hook_raising_any_base_exception_is_a_hook_failure(raised: BaseException, text: str) -> None:
    """Past every `except Exception`: a BaseException of the user's own or a
    GeneratorExit left the run hanging for good, and SystemExit or
    KeyboardInterrupt stopped the worker process (and the next one)."""

    class Raising(AgentHooks):
        async def before_tool_call(self, context: ToolCallContext) -> None:
            if context.tool_call.id == "b":
                raise raised

        def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> None:
            if context.tool_call.id == "a":
                raise raised

        def should_stop_after_turn(self, context: TurnContext) -> bool:
            if context.message.text == "stop?":
                raise raised
            return False

    fake = agent(calls(("a", "echo", {"text": "1"}), ("b", "echo", {"text": "2"})), say("stop?"))
    fake.hooks = Raising()
    messages = await run(fake)
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["a"].is_error and results["a"].content[0].text == text
    assert results["b"].is_error and results["b"].content[0].text == text
    assert messages[-1].stop_reason == "error"
    assert messages[-1].error_message == f"should_stop_after_turn failed: {text}"


async def test_cancelling_the_loop_while_a_hook_waits_still_cancels_it() -> None:
    """The workflow's own cancellation (Temporal's cancel request cancels its
    task) is not taken for the hook's failure: it goes on up."""
    waiting = asyncio.Event()

    class Slow(AgentHooks):
        async def before_tool_call(self, context: ToolCallContext) -> None:
            waiting.set()
            await asyncio.sleep(3600)

    fake = agent(calls(("a", "echo", {"text": "1"})), say("never"))
    fake.hooks = Slow()
    task = asyncio.create_task(run(fake))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "tool_execution_end" not in fake.outline()


# --- behaviours a mutation audit found untested (each test fails with its mutant) ---------------


async def test_a_steer_queued_before_the_prompt_joins_the_first_turn() -> None:
    """SPEC 3: ``pending`` starts with one steering poll; SPEC 6: queued
    messages are delivered by the next prompt's first steering poll."""
    fake = agent(say("answered both"))
    fake.steering.append(user("queued earlier"))
    messages = await run(fake)
    assert roles(messages) == ["user", "user", "assistant:stop"]
    assert roles(fake.model_contexts[0]) == ["user", "user"]
    assert fake.outline().count("turn_start") == 1
    assert [e.get("queue") for e in fake.events if e["type"] == "message_start"][:2] == [None, "steering"]


async def test_turn_end_carries_the_turns_tool_results() -> None:
    """SPEC 2 and 3.6: ``turn_end{message, toolResults}``."""
    fake = agent(calls(("c1", "echo", {"text": "a"}), ("c2", "echo", {"text": "b"})), say("ok"))
    await run(fake)
    first, last = [e for e in fake.events if e["type"] == "turn_end"]
    assert [r["toolCallId"] for r in first["toolResults"]] == ["c1", "c2"]
    assert first["toolResults"][0]["content"][0]["text"] == "echo: a"
    assert last["toolResults"] == []


async def test_a_steer_sent_during_aborted_tools_stays_queued() -> None:
    """SPEC 6: after a run ends by abort, queued messages stay queued (they
    were written into the transcript before the aborted message)."""
    fake = agent(calls(("a1", "stop", {"text": "x"})), say("never"))

    async def abort_and_steer(args: dict[str, Any]) -> str:
        fake.steering.append(user("steer"))
        fake.aborted = True
        return "stopped"

    fake.tool("stop", abort_and_steer)
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:toolUse", "toolResult:a1", "assistant:aborted"]
    assert [m.content for m in fake.steering] == ["steer"]


class _OverridingHooks(AgentHooks):
    """Blocks, flips ``isError`` and terminates, by the call's ``text``."""

    def before_tool_call(self, context: ToolCallContext) -> BlockToolCall | None:
        reasons: dict[str, Any] = {"block": ..., "block-none": None, "block-empty": ""}
        text = context.args["text"]
        if text not in reasons:
            return None
        return BlockToolCall() if reasons[text] is ... else BlockToolCall(reason=reasons[text])

    async def after_tool_call(
        self, context: ToolCallContext, outcome: ToolOutcome
    ) -> ToolResultOverride | None:
        overrides = {
            "flag": ToolResultOverride(is_error=True),
            "fail": ToolResultOverride(is_error=False),
            "end": ToolResultOverride(terminate=True),
        }
        return overrides.get(context.args["text"])


async def test_a_block_without_a_reason_says_the_default_and_never_runs_the_tool() -> None:
    """SPEC 5: the before-tool-call hook may block (``reason``, default
    ``Tool execution was blocked``), also with a reason of None or ''."""
    ran: list[str] = []

    async def tracked(args: dict[str, Any]) -> str:
        ran.append(args["text"])
        return "ran"

    fake = agent(
        calls(
            ("b1", "t", {"text": "block"}),
            ("b2", "t", {"text": "block-none"}),
            ("b3", "t", {"text": "block-empty"}),
        ),
        say("ok"),
    )
    fake.tool("t", tracked)
    fake.hooks = _OverridingHooks()
    messages = await run(fake)
    results = [m for m in messages if m.role == "toolResult"]
    assert [(r.is_error, r.content[0].text) for r in results] == [(True, "Tool execution was blocked")] * 3
    assert ran == []


async def test_the_after_hook_overrides_is_error_both_ways() -> None:
    """SPEC 5: the after-tool-call hook may replace ``content``,
    ``details``, ``isError``, ``terminate`` field by field."""

    async def failing(args: dict[str, Any]) -> str:
        if args["text"] == "fail":
            raise RuntimeError("tool failed")
        return "ok"

    fake = agent(calls(("f1", "t", {"text": "flag"}), ("f2", "t", {"text": "fail"})), say("ok"))
    fake.tool("t", failing)
    fake.hooks = _OverridingHooks()
    messages = await run(fake)
    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["f1"].is_error and results["f1"].content[0].text == "ok"
    assert not results["f2"].is_error and results["f2"].content[0].text == "tool failed"
    ends = {e["toolCallId"]: e["isError"] for e in fake.events if e["type"] == "tool_execution_end"}
    assert ends == {"f1": True, "f2": False}


async def test_the_after_hooks_terminate_ends_the_run_after_the_batch() -> None:
    fake = agent(calls(("e1", "echo", {"text": "end"})), say("never"))
    fake.hooks = _OverridingHooks()
    messages = await run(fake)
    assert roles(messages) == ["user", "assistant:toolUse", "toolResult:e1"]
    assert len(fake.model_contexts) == 1


async def test_prompts_a_continue_drained_from_a_queue_name_it() -> None:
    """``message_start.queue`` (this project's addition) says which queue
    a message came from, also for those ``continue`` runs as prompts."""
    fake = agent(say("ok"))
    context = fake.context([user("hi"), say("hello")])
    await run_agent_loop(
        [user("steer")], context, fake.config(), queue="steering", skip_initial_steering=True
    )
    starts = [e for e in fake.events if e["type"] == "message_start"]
    assert starts[0]["message"]["content"] == "steer" and starts[0]["queue"] == "steering"


def declared(**properties: Any) -> ToolDeclaration:
    return ToolDeclaration(name="t", parameters={"type": "object", "properties": properties})


def test_arguments_nested_deeper_than_the_workflow_decodes_are_refused() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_NESTING):
        deep = {"d": deep}
    said = f'Validation failed for tool "t": the arguments are nested deeper than {MAX_NESTING} levels.'
    with pytest.raises(ToolArgumentsError) as refused:
        validate_tool_arguments(declared(), {"d": deep})
    assert str(refused.value) == said


def test_a_schema_the_validator_cannot_read_accepts_any_object() -> None:
    """The tool's own model validates again in the activity."""
    tool = declared(a={"type": "no-such-type"})
    assert validate_tool_arguments(tool, {"a": 1, "b": "x"}) == {"a": 1, "b": "x"}


@pytest.mark.parametrize(
    ("kind", "sent", "received"),
    [
        ("number", "3", 3),
        ("number", "2.5", 2.5),
        ("integer", " 7 ", 7),
        ("boolean", "false", False),
        ("string", 12, "12"),
    ],
)
def test_scalars_are_coerced_to_the_type_the_schema_asks_for(kind: str, sent: Any, received: Any) -> None:
    checked = validate_tool_arguments(declared(v={"type": kind}), {"v": sent})
    assert checked == {"v": received} and type(checked["v"]) is type(received)


@pytest.mark.parametrize(
    ("kind", "sent"),
    [
        ("number", "nan"),
        ("number", "inf"),
        ("integer", "3.0"),
        ("integer", 3.5),
        ("boolean", "yes"),
        ("string", True),
    ],
)
def test_a_scalar_that_is_not_the_type_asked_for_is_refused_not_guessed(kind: str, sent: Any) -> None:
    with pytest.raises(ToolArgumentsError, match=f"  - v: .* is not of type '{kind}'"):
        validate_tool_arguments(declared(v={"type": kind}), {"v": sent})


def test_a_filled_in_default_is_a_copy_of_the_schemas() -> None:
    tool = declared(tags={"type": "array", "default": []})
    first = validate_tool_arguments(tool, {})
    first["tags"].append("changed by a hook")
    assert validate_tool_arguments(tool, {}) == {"tags": []}
    assert tool.parameters["properties"]["tags"]["default"] == []


def test_a_coercion_that_brings_new_rules_into_force_is_followed_by_another() -> None:
    """Coercing `n` makes the `if` hold, whose `then` asks for an integer `m`."""
    tool = ToolDeclaration(
        name="t",
        parameters={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "if": {"properties": {"n": {"const": 1}}},
            "then": {"properties": {"m": {"type": "integer"}}},
        },
    )
    assert validate_tool_arguments(tool, {"n": "1", "m": "2"}) == {"n": 1, "m": 2}


async def test_a_call_a_hook_asks_approval_for_without_a_reason_still_waits_for_a_person() -> None:
    """`RequireApproval(reason=None)` is let through as a reason (as for
    `BlockToolCall`): the call must still wait for the decision, not run."""

    class AskWithoutReason(AgentHooks):
        def before_tool_call(self, context: ToolCallContext) -> RequireApproval:
            return RequireApproval(reason=None)  # type: ignore[arg-type]

    fake = agent(calls(("r1", "echo", {"text": "a"})), say("ok"))
    fake.hooks = AskWithoutReason()
    fake.approvals["r1"] = ApprovalDecision(False, "Tool call echo was rejected: no")
    messages = await run(fake)

    result = next(m for m in messages if m.role == "toolResult")
    assert result.is_error and result.content[0].text == "Tool call echo was rejected: no"
    assert [e["toolCallId"] for e in fake.events if e["type"] == "approval_asked"] == ["r1"]


class _RaisingWhere(AgentHooks):
    """Raises ``error`` from the hook named ``where``."""

    def __init__(self, where: str, error: BaseException) -> None:
        self.where, self.error = where, error

    def before_tool_call(self, context: ToolCallContext) -> None:
        if self.where == "before":
            raise self.error

    async def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> None:
        if self.where == "after":
            raise self.error

    def should_stop_after_turn(self, context: TurnContext) -> bool:
        if self.where == "stop":
            raise self.error
        return False


@pytest.mark.parametrize("where", ["before", "after", "stop"])
async def test_the_sdks_own_control_flow_out_of_a_hook_goes_on_up(where: str) -> None:
    """An eviction (or continue-as-new) raised while a hook runs is the
    SDK's, not the hook's failure: it must not become an error result."""
    fake = agent(calls(("a", "echo", {"text": "1"})), say("never"))
    fake.hooks = _RaisingWhere(where, _WorkflowBeingEvictedError())

    with pytest.raises(_WorkflowBeingEvictedError):
        await run(fake)
    assert not any(e["type"] == "agent_end" for e in fake.events)


async def test_a_call_a_hook_asks_approval_for_says_why_by_default() -> None:
    """`RequireApproval()` publishes its default reason with the request."""

    class Ask(AgentHooks):
        def before_tool_call(self, context: ToolCallContext) -> RequireApproval:
            return RequireApproval()

    asked: list[str | None] = []

    async def approve(prepared: PreparedToolCall) -> ApprovalDecision:
        asked.append(prepared.approval)
        return ApprovalDecision(True)

    fake = agent(calls(("r1", "echo", {"text": "a"})), say("ok"))
    fake.hooks = Ask()
    await run_agent_loop([user("go")], fake.context(), replace(fake.config(), request_approval=approve))

    assert asked == ["This tool call needs approval"]


class MissingSetting(KeyError):
    """A KeyError of the user's own, with a message of its own."""

    def __str__(self) -> str:
        return f"setting {self.args[0]} is missing"


@pytest.mark.parametrize(
    ("raised", "text"),
    [
        (MissingSetting("region"), "setting region is missing"),
        (KeyError(42), "42"),
        (KeyError(), "KeyError"),
        (KeyError("a", "b"), "('a', 'b')"),
    ],
    ids=["subclass", "not-text", "no-argument", "two-arguments"],
)
def test_a_key_error_is_worded_by_its_own_str_unless_it_is_a_plain_one_of_text(
    raised: KeyError, text: str
) -> None:
    """Only a plain `KeyError("name")` is shown unquoted: a subclass keeps
    its own message, and any other KeyError is worded as Python words it."""
    assert failure_text(raised) == text


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str exploded")


class _StrNotText(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("raised", "text"),
    [
        (_StrRaises(), "_StrRaises (its message could not be read: RuntimeError)"),
        (_StrNotText(), "_StrNotText (its message could not be read: TypeError)"),
    ],
    ids=["str-raises", "str-not-text"],
)
def test_an_exception_whose_message_cannot_be_read_is_worded_by_its_type(
    raised: Exception, text: str
) -> None:
    """Raised from `failure_text`, inside the loop's except clauses, it
    failed every workflow task; inside a tool, it ran the tool again."""
    assert failure_text(raised) == text


async def test_a_before_hook_returning_something_else_is_the_calls_error_and_the_tool_does_not_run() -> None:
    """README: a wrong return value is the call's error result, naming what
    came back; it is no permission to run the call."""
    ran: list[str] = []

    async def tracked(args: dict[str, Any]) -> str:
        ran.append(args["text"])
        return "ran"

    class Yes(AgentHooks):
        def before_tool_call(self, context: ToolCallContext) -> Any:
            return "yes"

    fake = agent(calls(("y1", "t", {"text": "a"})), say("ok"))
    fake.tool("t", tracked)
    fake.hooks = Yes()
    messages = await run(fake)

    result = next(m for m in messages if m.role == "toolResult")
    assert result.is_error and result.content[0].text == (
        "before_tool_call returned str; expected BlockToolCall, RequireApproval or None."
    )
    assert ran == []


class _Emptying(AgentHooks):
    """Replaces a result's content or details with an empty value."""

    async def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> ToolResultOverride:
        if context.args["text"] == "no-content":
            return ToolResultOverride(content=[])
        return ToolResultOverride(details={})


async def test_an_after_hook_may_replace_content_or_details_with_an_empty_value() -> None:
    """SPEC 5: each field of the override that is not None replaces the
    result's: an empty content list or empty details too (a redaction)."""

    async def detailed(args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(content=text_result("secret output"), details={"secret": "value"})

    fake = agent(calls(("c1", "t", {"text": "no-content"}), ("d1", "t", {"text": "no-details"})), say("ok"))
    fake.tool("t", detailed)
    fake.hooks = _Emptying()
    messages = await run(fake)

    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["c1"].content == [] and results["c1"].details == {"secret": "value"}
    assert results["d1"].content[0].text == "secret output" and results["d1"].details == {}


async def test_a_stop_hook_returning_something_other_than_a_bool_ends_the_run_with_an_error() -> None:
    """README: a wrong return value of `should_stop_after_turn` ends the run
    with an `error` message (a truthy "yes" is no decision)."""

    class Says(AgentHooks):
        def should_stop_after_turn(self, context: TurnContext) -> Any:
            return "yes"

    fake = agent(say("hi"), say("never"))
    fake.hooks = Says()
    fake.follow_up.append(user("later"))
    messages = await run(fake)

    assert messages[-1].stop_reason == "error"
    assert messages[-1].error_message == "should_stop_after_turn failed: it returned str, not a bool"


class _AwaitableNone:
    """An awaitable that is no coroutine (as a Future or a task is)."""

    def __await__(self) -> Iterator[None]:
        return iter(())


async def test_a_hook_may_return_any_awaitable_not_only_a_coroutine() -> None:
    """Hooks may be `async`: what they return is awaited if it is awaitable
    (a future, a task), not taken for their decision."""

    class Deferring(AgentHooks):
        def before_tool_call(self, context: ToolCallContext) -> Any:
            return _AwaitableNone()

    fake = agent(calls(("a1", "echo", {"text": "x"})), say("ok"))
    fake.hooks = Deferring()
    messages = await run(fake)

    result = next(m for m in messages if m.role == "toolResult")
    assert not result.is_error and result.content[0].text == "echo: x"


async def test_the_stop_hook_sees_the_conversations_total_turns() -> None:
    """`TurnContext.total_turns` counts every run's turns, `run_turns` this run's."""
    seen: list[tuple[int, int]] = []

    class Counting(AgentHooks):
        def should_stop_after_turn(self, context: TurnContext) -> bool:
            seen.append((context.run_turns, context.total_turns))
            return False

    fake = agent(say("hi"))
    fake.hooks = Counting()
    await run_agent_loop([user("go")], fake.context(), replace(fake.config(), total_turns=lambda: 7))

    assert seen == [(1, 7)]


class _Unsendable(AgentHooks):
    def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> ToolResultOverride | None:
        text = context.args["text"]
        if text == "object":
            return ToolResultOverride(details={"marker": object()})
        if text == "deep":
            deep: Any = {}
            for _ in range(MAX_NESTING + 5):
                deep = {"d": deep}
            return ToolResultOverride(details=deep)
        if text == "when":
            return ToolResultOverride(details={"when": datetime(2026, 1, 1, tzinfo=UTC)})
        return None


async def test_details_an_after_hook_sets_that_no_payload_can_carry_are_the_calls_error() -> None:
    """SPEC 8: no user-code failure may leave a workflow task failing. An
    override whose details the converter cannot write (an object of the
    hook's own) failed every workflow task as its `tool_execution_end` was
    published (a parity audit); too deep, it failed at the next
    continue-as-new. Each is now the call's error result; a datetime,
    which the converter writes as text, is kept."""
    fake = agent(
        calls(
            ("o1", "echo", {"text": "object"}),
            ("d1", "echo", {"text": "deep"}),
            ("w1", "echo", {"text": "when"}),
        ),
        say("ok"),
    )
    fake.hooks = _Unsendable()
    messages = await run(fake)

    results = {m.tool_call_id: m for m in messages if m.role == "toolResult"}
    assert results["o1"].is_error and results["o1"].content[0].text.startswith(
        "after_tool_call returned details that cannot be sent as JSON: Unable to serialize unknown type"
    )
    assert results["d1"].is_error and results["d1"].content[0].text == (
        f"after_tool_call returned details nested deeper than {MAX_NESTING} levels."
    )
    assert not results["w1"].is_error and results["w1"].details == {"when": datetime(2026, 1, 1, tzinfo=UTC)}
    assert messages[-1].text == "ok"
    assert [e["type"] for e in fake.events].count("tool_execution_end") == 3


async def test_arguments_a_shim_returns_that_no_payload_can_carry_are_the_calls_error() -> None:
    """A `prepare_arguments` shim adding a value of its own under a key the
    schema leaves open passed validation and failed every workflow task
    that sent the call on (a parity audit): it is the call's error result,
    and the tool does not run."""
    ran: list[str] = []

    async def recording(args: dict[str, Any]) -> str:
        ran.append(args["text"])
        return "ran"

    fake = agent(calls(("s1", "t", {"text": "odd"}), ("s2", "t", {"text": "fine"})), say("ok"))
    fake.tool("t", recording)

    def shim(call: Any) -> dict[str, Any]:
        return {**call.arguments, "extra": object()} if call.arguments["text"] == "odd" else call.arguments

    context = fake.context()
    await run_agent_loop([user("go")], context, replace(fake.config(), prepare_arguments=shim))

    results = {m.tool_call_id: m for m in context.messages if m.role == "toolResult"}
    assert results["s1"].is_error and results["s1"].content[0].text.startswith(
        "prepare_arguments of t returned arguments that cannot be sent as JSON: "
        "Unable to serialize unknown type"
    )
    assert ran == ["fine"] and not results["s2"].is_error


def test_a_calls_summary_shows_a_shims_datetime_as_text() -> None:
    """The UI's summary of a call (`tool: NAME k=v`) wrote its values with
    plain `json.dumps`, which refuses a datetime a shim added: every
    workflow task failed as it scheduled the call (a parity audit)."""
    when = datetime(2026, 1, 1, tzinfo=UTC)
    summary = tool_summary("stamp", {"text": "hi", "at": when})
    assert summary == 'tool: stamp text=hi at="2026-01-01 00:00:00+00:00"'


async def test_a_run_that_begins_aborted_leaves_the_steering_queue_as_it_is() -> None:
    """SPEC 6: after a run ends by abort, queued messages stay queued. The
    loop skipped the steering poll after an abort mid-run, but a run whose
    abort came before it began took one steer into its transcript, just
    before its aborted message (a parity audit): never answered, and gone
    from the queue that `clear_queues` returns."""
    fake = agent(say("never"))
    fake.steering.append(user("queued steer"))
    fake.aborted = True
    messages = await run(fake)

    assert roles(messages) == ["user", "assistant:aborted"]
    assert [m.content for m in fake.steering] == ["queued steer"]
    assert fake.model_contexts == []


class _Surrogates(AgentHooks):
    """Text with a lone surrogate (a file name read with surrogateescape), from every hook."""

    def before_tool_call(self, context: ToolCallContext) -> Any:
        text = context.args["text"]
        if text == "raise":
            raise FileNotFoundError("no file named caf\udce9")
        if text == "block":
            return BlockToolCall(reason="blocked: caf\udce9")
        if text == "approve":
            return RequireApproval(reason="asks for caf\udce9")
        return None

    def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> ToolResultOverride | None:
        if context.args["text"] == "override":
            return ToolResultOverride(content="redacted caf\udce9")
        if context.args["text"] == "blocks":
            return ToolResultOverride(content=[TextContent(text="caf\udce9", text_signature="kept")])
        return None


async def test_text_a_hook_gives_with_a_lone_surrogate_is_written_with_a_replacement() -> None:
    """A lone surrogate cannot be written as UTF-8: a hook raising with a
    file name read by `os.listdir` in its message, or giving such a reason
    or content, failed every workflow task as the event was written. The
    text goes on with U+FFFD in its place."""
    fake = agent(
        calls(
            ("r1", "echo", {"text": "raise"}),
            ("b1", "echo", {"text": "block"}),
            ("a1", "echo", {"text": "approve"}),
            ("o1", "echo", {"text": "override"}),
            ("o2", "echo", {"text": "blocks"}),
        ),
        say("ok"),
    )
    fake.hooks = _Surrogates()
    messages = await run(fake)
    [block] = next(m for m in messages if m.role == "toolResult" and m.tool_call_id == "o2").content
    assert block == TextContent(text="caf\ufffd", text_signature="kept")

    texts = {m.tool_call_id: m.content[0].text for m in messages if m.role == "toolResult"}
    assert texts == {
        "r1": "no file named caf\ufffd",
        "b1": "blocked: caf\ufffd",
        "a1": "echo: approve",
        "o1": "redacted caf\ufffd",
        "o2": "caf\ufffd",
    }
    to_json(fake.events)  # every event can be written
    assert messages[-1].text == "ok"


@pytest.mark.parametrize("pi_view", [True, False], ids=["batch-start", "recorded-before"])
async def test_hooks_of_a_sequential_batch_see_the_transcript_as_pi_hands_it(pi_view: bool) -> None:
    """pi adds a batch's results to its context when the batch ends: the
    hooks of a sequential batch's second call do not see the first call's
    result (they did here, a pi-parity audit). A run recorded before
    (``hooks_see_batch_start`` False) keeps what its hooks saw."""
    seen: list[tuple[str, str, list[str]]] = []

    class Watching(AgentHooks):
        def before_tool_call(self, context: ToolCallContext) -> None:
            seen.append(("before", context.tool_call.id, roles(context.messages)))

        def after_tool_call(self, context: ToolCallContext, outcome: ToolOutcome) -> None:
            seen.append(("after", context.tool_call.id, roles(context.messages)))

    fake = agent(calls(("s1", "echo", {"text": "a"}), ("s2", "echo", {"text": "b"})), say("done"))
    fake.tool_execution = "sequential"
    fake.hooks = Watching()
    context = fake.context()
    config = replace(fake.config(), hooks_see_batch_start=lambda: pi_view)
    await run_agent_loop([user("go")], context, config)

    batch_start = ["user", "assistant:toolUse"]
    with_first = [*batch_start, *([] if pi_view else ["toolResult:s1"])]
    assert seen == [
        ("before", "s1", batch_start),
        ("after", "s1", batch_start),
        ("before", "s2", with_first),
        ("after", "s2", with_first),
    ]
    assert roles(context.messages) == [*batch_start, "toolResult:s1", "toolResult:s2", "assistant:stop"]


@pytest.mark.parametrize("keeps", [True, False], ids=["kept", "recorded-before"])
async def test_an_abort_taken_at_a_turn_boundary_keeps_the_follow_ups_queued(keeps: bool) -> None:
    """SPEC 6: after a run ends by abort, queued follow-ups stay queued. An
    abort taken while the run switched to continue-as-new after a turn
    without tool calls found the follow-up poll unguarded: the follow-up
    went into the aborted turn (a pi-parity audit). A run recorded before
    (``abort_before_follow_ups`` False) replays as it went."""
    fake = agent(say("answered"), say("never"))
    fake.follow_up.append(user("later"))

    async def abort_during_the_switch() -> None:
        fake.aborted = True

    context = fake.context()
    config = replace(
        fake.config(), at_turn_boundary=abort_during_the_switch, abort_before_follow_ups=lambda: keeps
    )
    await run_agent_loop([user("go")], context, config)

    assert fake.model_contexts and len(fake.model_contexts) == 1  # the model is not called again
    if keeps:
        assert [m.content for m in fake.follow_up] == ["later"]
        assert roles(context.messages) == ["user", "assistant:stop", "assistant:aborted"]
    else:
        assert fake.follow_up == []
        assert roles(context.messages) == ["user", "assistant:stop", "user", "assistant:aborted"]
    assert fake.outline()[-1].startswith("agent_end")
