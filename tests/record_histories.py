"""Record the workflow histories that tests/test_replay.py replays.

    python -m tests.record_histories [SCENARIO ...]   # all, or the ones named

Runs each scenario on an embedded dev server with an in-process worker and
the scripted model, and writes its history to tests/histories/NAME.json.
Record again (and commit) only for a deliberate change of the workflow's
commands; a change that would break running conversations must instead be
guarded with ``workflow.patched`` (see the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

import activities.builtin_tools  # noqa: F401
import tests.support.tools  # noqa: F401
from client import follow, start_conversation
from runtime.connect import connect
from runtime.settings import Settings
from testbed.local_stack import DevServer
from testbed.scripted_model import ScriptedModelServer
from tests.support.recording_hooks import RecordingHooks
from tests.support.stack import EventLog, accepted_updates
from worker import build_worker
from workflows.stream import RUN_END_UPDATE

# Recordings of the current version; tests/histories/v1/ keeps those made
# before tool declarations were recorded (they replay on the legacy path).
HISTORIES = Path(__file__).resolve().parent / "histories"
TASK_QUEUE = "record"


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


Scenario = Callable[[Client, ScriptedModelServer, str], Awaitable[WorkflowHandle[Any, Any]]]


async def start(
    client: Client, model: str, *, start_signal: str | None = None, **input: Any
) -> WorkflowHandle[Any, Any]:
    return await start_conversation(
        client,
        f"rec-{uuid.uuid4().hex[:8]}",
        {"model": model, **input},
        task_queue=TASK_QUEUE,
        start_signal=start_signal,
    )


async def tools(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    server.script(
        model,
        [
            {
                "tool_calls": [
                    call("a", "echo", text="1", delay=0.3),
                    call("b", "calculator", expression="2+2"),
                ]
            },
            {"tool_calls": [call("c", "sequential_echo", text="s"), call("d", "no_such_tool")]},
            {"tool_calls": [call("e", "explode"), call("f", "calculator", bad=1)]},
            {"text": "done", "reasoning": "all tools ran"},
        ],
    )
    handle = await start(client, model, prompt="use tools", closeWhenIdle=True)
    await handle.result()
    return handle


async def steering_and_follow_up(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    server.script(
        model, [{"tool_calls": [call("s", "slow", seconds=1.0)]}, {"text": "steered"}, {"text": "followed"}]
    )
    handle = await start(client, model, prompt="work", closeWhenIdle=True)
    log = EventLog(client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_start" for e in es))
    await handle.signal("steer", "steer now")
    await handle.signal("follow_up", "then this")
    await handle.result()
    log.close()
    return handle


async def abort_and_prompt(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    server.script(
        model,
        [
            {"tool_calls": [call("r", "slow", seconds=10)]},
            {"text": "long " * 100, "delay_ms": 30},
            {"text": "ok"},
        ],
    )
    handle = await start(client, model, prompt="start")
    log = EventLog(client, handle.id)
    await log.wait_until(lambda es: any(e["type"] == "tool_execution_update" for e in es))
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    await handle.execute_update("prompt", "again")
    await log.wait_until(lambda es: sum(e["type"] == "message_update" for e in es) > 5)
    await handle.signal("abort")
    await log.wait_for_type("agent_end", count=2)
    await handle.signal("steer", "idle steer starts a run")
    await log.wait_for_type("agent_end", count=3)
    await handle.signal("close")
    await handle.result()
    log.close()
    return handle


async def errors(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    server.script(
        model,
        [
            {"fault": {"kind": "status", "status": 429, "retry_after": 1}},
            {"tool_calls": [call("l", "echo", text="x")], "finish_reason": "length"},
            {"fault": {"kind": "status", "status": 400, "message": "bad request"}},
        ],
    )
    handle = await start(client, model, prompt="fail", closeWhenIdle=True)
    await handle.result()
    return handle


async def continue_as_new(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    steps: list[dict[str, Any]] = [{"tool_calls": [call(f"t{i}", "echo", text=str(i))]} for i in range(7)]
    server.script(model, [*steps, {"text": "done"}])
    handle = await start(client, model, prompt="count", closeWhenIdle=True, continueAsNewAfterTurns=3)
    await handle.result()
    return client.get_workflow_handle(handle.id)


async def subscriber_at_close(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    # The subscriber is between polls when the answer ends: the conversation
    # waits for its next poll before completing (the linger-for-subscribers
    # patch).
    server.script(model, [{"text": "the end " * 8, "delay_ms": 20, "chunk_chars": 4}])
    handle = await start(client, model, prompt="finish", closeWhenIdle=True)
    paused = False
    async for _, event in follow(client, handle.id):
        if event["type"] == "message_update" and not paused:
            paused = True  # stop reading until the conversation waits for us
            while not any(
                e.HasField("timer_started_event_attributes") for e in (await handle.fetch_history()).events
            ):
                await asyncio.sleep(0.05)
    await handle.result()
    return handle


async def busy_subscriber(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    # A subscriber reading a long streamed answer after cooldowns: its one
    # update waiting for the run's end is in the history.
    server.script(
        model,
        [
            {"tool_calls": [call("b", "echo", text="x")], "text": "checking " * 10, "delay_ms": 5},
            {"text": "a long streamed answer " * 30, "delay_ms": 5, "chunk_chars": 4},
        ],
    )
    handle = await start(client, model, prompt="stream", closeWhenIdle=True)
    async for _, event in follow(client, handle.id):
        if event["type"] == "agent_end":
            break
    await handle.result()
    accepted = accepted_updates(await handle.fetch_history())
    assert RUN_END_UPDATE in accepted, accepted
    return handle


async def agent_api(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """SPEC §8: a prompt with a list, configure, clear_queues, reset, wait_for_idle."""
    server.script(
        model,
        [
            {"tool_calls": [call("w", "slow", seconds=0.5)]},
            {"text": "first"},
            {"text": "after configure"},
            {"text": "after reset"},
        ],
    )
    handle = await start(client, model)
    await handle.execute_update("prompt", ["one", "two"])
    log = EventLog(client, handle.id)
    await log.wait_for_type("tool_execution_start")
    await handle.signal("follow_up", "cleared before it runs")
    await handle.execute_update("clear_queues", "all")
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("configure", {"systemPrompt": "Be brief.", "tools": ["calculator"]})
    await handle.execute_update("prompt", "again")
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("reset")
    await handle.execute_update("prompt", "fresh")
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")
    await handle.result()
    log.close()
    return handle


async def approval(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """SPEC §9: one call approved, one rejected, beside a call that needs none."""
    server.script(
        model,
        [
            {
                "tool_calls": [
                    call("a", "guarded_echo", text="yes"),
                    call("b", "guarded_echo", text="no"),
                    call("c", "echo", text="free"),
                ]
            },
            {"text": "done"},
        ],
    )
    handle = await start(client, model, prompt="ask", closeWhenIdle=True)
    log = EventLog(client, handle.id)
    await log.wait_for_type("tool_approval_request", count=2)
    await handle.execute_update("approve_tool", {"toolCallId": "a", "approved": True})
    await handle.execute_update("approve_tool", {"toolCallId": "b", "approved": False, "reason": "not now"})
    await handle.result()
    log.close()
    return handle


async def continued(client: Client, workflow_id: str) -> None:
    """Until the conversation has continued as new (at most ~10 s)."""
    for _ in range(100):
        runs = [e async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
        if len(runs) > 1:
            return
        await asyncio.sleep(0.1)


async def idle_switch(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """A run long enough (over 500 history events) that the conversation,
    once idle, continues as new at once; then one more prompt."""
    steps: list[dict[str, Any]] = [
        {"tool_calls": [call(f"t{i}", "calculator", expression=f"{i}+1")]} for i in range(45)
    ]
    server.script(model, [*steps, {"text": "done"}, {"text": "after the switch"}])
    handle = await start(client, model, prompt="count")
    await handle.execute_update("wait_for_idle")
    await continued(client, handle.id)
    while True:
        try:
            await client.get_workflow_handle(handle.id).execute_update("prompt", "again")
            break
        except Exception:
            await asyncio.sleep(0.1)
    await client.get_workflow_handle(handle.id).signal("close")
    await client.get_workflow_handle(handle.id).result()
    return client.get_workflow_handle(handle.id)


async def abort_before_switch(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """A streamed answer aborted in a run that continues as new once idle:
    the run waits for the aborted call to end before it switches
    (await-aborted-model-call; before, the call's late deltas reached the
    next run, which dropped them: drop-carried-publishers); then one more
    prompt."""
    server.script(
        model, [{"text": "old answer " * 60, "delay_ms": 40, "chunk_chars": 6}, {"text": "the new answer"}]
    )
    handle = await start(client, model, prompt="talk", continueAsNewAfterTurns=1)
    log = EventLog(client, handle.id)
    await log.wait_until(lambda es: sum(e["type"] == "message_update" for e in es) > 2)
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    await continued(client, handle.id)
    await asyncio.sleep(1.5)  # the aborted call's late batches
    latest = client.get_workflow_handle(handle.id)
    await latest.execute_update("prompt", "again")
    await log.wait_for_type("agent_end", count=2)
    log.close()
    await latest.signal("close")
    await latest.result()
    return latest


async def search_attributes(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    # Twelve quick turns: how often the counters are upserted during a run
    # is in the commands (turn 10 before the search-attributes-by-time patch).
    steps: list[dict[str, Any]] = [{"tool_calls": [call(f"e{i}", "echo", text=str(i))]} for i in range(11)]
    server.script(model, [*steps, {"text": "done"}])
    handle = await start(client, model, prompt="count", closeWhenIdle=True)
    await handle.result()
    return handle


async def idle_waiter_at_switch(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """``wait_for_idle`` asked during a run that is due to continue as new
    after each turn (before the hold-switch-for-idle-waiters patch the run
    switched mid-run and the waiter was told to ask again)."""
    server.script(
        model,
        [
            {"tool_calls": [call("w0", "echo", text="0", delay=0.3)]},
            {"tool_calls": [call("w1", "echo", text="1")]},
            {"text": "done"},
        ],
    )
    handle = await start(client, model, prompt="count", continueAsNewAfterTurns=1)
    latest = client.get_workflow_handle(handle.id)
    for _ in range(10):
        try:
            await latest.execute_update("wait_for_idle")
            break
        except Exception as err:  # the old path: ContinuedAsNew, ask again
            print(f"wait_for_idle: {getattr(err, 'cause', err)}")
    await latest.signal("close")
    await latest.result()
    return latest


async def closed_once_idle(handle: WorkflowHandle[Any, Any]) -> WorkflowHandle[Any, Any]:
    """Wait for the run to end, then close the conversation and let it complete."""
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")
    await handle.result()
    return handle


async def abort_at_start(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """A prompt started with an abort signal (signal-with-start): before the
    abort-before-run-start patch the abort was dropped and the run ran."""
    server.script(model, [{"text": "answered"}])
    handle = await start(client, model, prompt="hi", closeWhenIdle=True, start_signal="abort")
    await handle.result()
    return handle


async def stop_at_start(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """A prompt started with a stop_after_turn signal: the run ends after its
    first turn (before the patch the signal was dropped)."""
    server.script(model, [{"tool_calls": [call("t1", "calculator", expression="1+1")]}, {"text": "two"}])
    handle = await start(client, model, prompt="add", start_signal="stop_after_turn")
    return await closed_once_idle(handle)


async def continue_after_app(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """A follow-up arriving while idle after an application message: the
    model answers the transcript first, then the follow-up (before the
    continue-after-app-message patch the follow-up ran as the prompt)."""
    server.script(model, [{"text": "answered"}, {"text": "followed"}])
    note = {"role": "note", "content": "for the app only"}
    handle = await start(client, model, messages=[{"role": "user", "content": "q"}, note])
    await handle.signal("follow_up", "and then?")
    return await closed_once_idle(handle)


async def unknown_start_key(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """A start input with a key the workflow does not know: it fails with a
    sentence (before the strict-start-input patch it was ignored)."""
    server.script(model, [{"text": "answered"}])
    handle = await start(client, model, prompt="hi", closeWhenIdle=True, sytemPrompt="Be brief.")
    try:
        await handle.result()
    except Exception as err:  # the new path: InvalidInput
        print(f"unknown_start_key: {getattr(err, 'cause', err)}")
    return handle


async def big_tool_arguments(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """One answer with ~1.2 MB of tool arguments (compressible, so the
    history stays small): scheduled ~1 MB at a time (before the
    tool-argument-bytes patch, all at once)."""
    calls = [call(f"b{i}", "echo", text=f"{i}" + "x" * 120 * 1024) for i in range(10)]
    server.script(model, [{"tool_calls": calls, "chunk_chars": 64 * 1024}, {"text": "all echoed"}])
    handle = await start(client, model, prompt="big", closeWhenIdle=True)
    await handle.result()
    return handle


async def long_tool_batch(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """One answer with 1,001 tool calls, all but three to a tool no worker
    has (each gets its error result at once, so the history stays small):
    prepared and given results in parts of 500, a 1 ms timer between them
    (before the tool-batch-in-parts patch, all in one workflow task)."""
    calls = [call(f"e{i}", "echo", text=str(i)) for i in range(3)]
    calls += [call(f"m{i}", "no_such_tool") for i in range(998)]
    server.script(model, [{"tool_calls": calls, "chunk_chars": 16 * 1024}, {"text": "done"}])
    handle = await start(client, model, prompt="many", closeWhenIdle=True)
    await handle.result()
    return handle


async def hook_abort(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """An abort while a before_tool_call hook waits on a timer
    (``RecordingHooks``): the hook's wait ends at the abort
    (abortable-hooks; before, the abort waited for the timer)."""
    server.script(model, [{"tool_calls": [call("hw", "echo", text="hook-waits")]}, {"text": "never asked"}])
    handle = await start(client, model, prompt="wait in the hook")
    log = EventLog(client, handle.id)
    await log.wait_for_type("tool_execution_start")
    await asyncio.sleep(0.5)  # the hook's timer is started
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    log.close()
    await handle.signal("close")
    await handle.result()
    return handle


async def approval_configure(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """``configure`` sets approvalTimeoutSeconds while a call waits, past
    the new deadline: it times out at once (approval-timeout-follows-configure;
    before, the wait went on and the approval sent next ran it)."""
    server.script(model, [{"tool_calls": [call("w", "guarded_echo", text="wait")]}, {"text": "done"}])
    handle = await start(client, model, prompt="ask", closeWhenIdle=True)
    log = EventLog(client, handle.id)
    await log.wait_for_type("tool_approval_request")
    await asyncio.sleep(1.5)
    await handle.execute_update("configure", {"approvalTimeoutSeconds": 1})
    # Refused once the wait timed out (or the conversation, idle, has closed).
    with contextlib.suppress(WorkflowUpdateFailedError, RPCError):
        await handle.execute_update("approve_tool", {"toolCallId": "w", "approved": True})
    await handle.result()
    log.close()
    return handle


async def hook_approval_no_reason(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """A before_tool_call hook returns ``RequireApproval(reason=None)``
    (``RecordingHooks``): the call waits for a person, who approves it
    (approval-without-reason; before, it ran without asking)."""
    server.script(model, [{"tool_calls": [call("ha", "echo", text="hook-asks-approval")]}, {"text": "done"}])
    handle = await start(client, model, prompt="ask first", closeWhenIdle=True)
    log = EventLog(client, handle.id)
    decisive = ("tool_approval_request", "agent_end")
    events = await log.wait_until(lambda events: any(e["type"] in decisive for e in events))
    if next(e for e in events if e["type"] in decisive)["type"] == "tool_approval_request":
        await handle.execute_update("approve_tool", {"toolCallId": "ha", "approved": True})
    await handle.result()
    log.close()
    return handle


async def override_flag_as_text(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """An after_tool_call hook returns ``ToolResultOverride(terminate="false")``
    (``RecordingHooks``): the call's error result, and the run goes on
    (strict-override-flags; before, the text's truth ended the run)."""
    server.script(
        model, [{"tool_calls": [call("ht", "echo", text="hook-terminates-as-text")]}, {"text": "done"}]
    )
    handle = await start(client, model, prompt="go", closeWhenIdle=True)
    await handle.result()
    return handle


async def close_mid_run(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """A close while a tool runs: the turns that end after it reach
    AgentTurns in an upsert at the end (search-attribute-counters-now;
    before, the counters stayed as the close found them)."""
    server.script(model, [{"tool_calls": [call("cs", "slow", seconds=300, steps=300)]}])
    handle = await start(client, model, prompt="work")
    log = EventLog(client, handle.id)
    await log.wait_for_type("tool_execution_start")
    log.close()
    await handle.signal("close")
    await handle.result()
    return handle


async def reset_counters(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """A reset after a run: its counters are upserted at once
    (search-attribute-counters-now; before, they kept the run's figures)."""
    server.script(model, [{"text": "four", "usage": {"prompt_tokens": 10, "completion_tokens": 3}}])
    handle = await start(client, model, prompt="2+2?")
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("reset")
    await handle.signal("close")
    await handle.result()
    return handle


async def sequential_hook_view(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """A sequential batch whose second call's before_tool_call hook
    (``RecordingHooks``) blocks it if handed the first call's result: it
    runs (hooks-see-batch-start; before, the hook saw it and blocked)."""
    server.script(
        model,
        [
            {
                "tool_calls": [
                    call("q1", "sequential_echo", text="first"),
                    call("q2", "sequential_echo", text="hook-sees-results"),
                ]
            },
            {"text": "done"},
        ],
    )
    handle = await start(client, model, prompt="in order", closeWhenIdle=True)
    await handle.result()
    return handle


async def counters_timer(client: Client, server: ScriptedModelServer, model: str) -> WorkflowHandle[Any, Any]:
    """A tool longer than SEARCH_ATTRIBUTE_INTERVAL: the counters' timer
    fires while it runs and the counters go with the tool's end
    (clock-free-commands; before, the upsert waited for the clock)."""
    server.script(
        model,
        [
            {"tool_calls": [call("w1", "slow", seconds=10.5, steps=2)]},
            {"tool_calls": [call("w2", "echo", text="after")]},
            {"text": "done"},
        ],
    )
    handle = await start(client, model, prompt="wait", closeWhenIdle=True)
    await handle.result()
    return handle


async def _aborted_with_a_follow_up_queued(client: Client, handle: WorkflowHandle[Any, Any]) -> None:
    """Once the answer streams: a follow-up, then an abort; back when the
    run has ended (the follow-up kept queued)."""
    log = EventLog(client, handle.id)
    await log.wait_for_type("message_update")
    await handle.signal("follow_up", "later")
    await handle.signal("abort")
    await log.wait_for_type("agent_end")
    log.close()


async def cleared_queues_close(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """A closeWhenIdle conversation that an abort left idle with a follow-up
    queued completes once ``clear_queues`` drops it (cleared-queues-complete;
    before, it stayed open: the prompt and the ``close`` sent here then
    make commands the new path never makes)."""
    server.script(
        model, [{"text": "a slow answer " * 40, "delay_ms": 50, "chunk_chars": 4}, {"text": "open still"}]
    )
    handle = await start(client, model, prompt="hi", closeWhenIdle=True)
    await _aborted_with_a_follow_up_queued(client, handle)
    await handle.execute_update("clear_queues", "all")
    try:
        await asyncio.wait_for(handle.result(), 5)
    except TimeoutError:  # the old path: it stays open
        await handle.execute_update("prompt", "still there?")
        await handle.execute_update("wait_for_idle")
        await handle.signal("close")
        await handle.result()
    return handle


async def cleared_queues_switched(
    client: Client, server: ScriptedModelServer, model: str
) -> WorkflowHandle[Any, Any]:
    """As cleared_queues_close, but the conversation continued as new
    while it waited (continueAsNewAfterTurns=1): its next run completes once
    ``clear_queues`` drops the follow-up (carried-run-end; before, it stayed
    open: the prompt and the ``close`` sent here then make commands the new
    path never makes)."""
    server.script(
        model, [{"text": "a slow answer " * 40, "delay_ms": 50, "chunk_chars": 4}, {"text": "open still"}]
    )
    handle = await start(client, model, prompt="hi", closeWhenIdle=True, continueAsNewAfterTurns=1)
    first_run = (await handle.describe()).run_id
    await _aborted_with_a_follow_up_queued(client, handle)
    latest = client.get_workflow_handle(handle.id)
    while (await latest.describe()).run_id == first_run:  # it continues as new while idle
        await asyncio.sleep(0.1)
    await latest.execute_update("clear_queues", "all")
    try:
        await asyncio.wait_for(latest.result(), 5)
    except TimeoutError:  # the old path: it stays open, until its next run ends
        await latest.execute_update("prompt", "still there?")
        await latest.execute_update("wait_for_idle")
        with contextlib.suppress(RPCError):  # closed by then, or closed by this
            await latest.signal("close")
        await latest.result()
    return handle


SCENARIOS: dict[str, Scenario] = {
    "tools": tools,
    "steering_and_follow_up": steering_and_follow_up,
    "abort_and_prompt": abort_and_prompt,
    "errors": errors,
    "continue_as_new": continue_as_new,
    "subscriber_at_close": subscriber_at_close,
    "busy_subscriber": busy_subscriber,
    "agent_api": agent_api,
    "approval": approval,
    "idle_switch": idle_switch,
    "search_attributes": search_attributes,
    "idle_waiter_at_switch": idle_waiter_at_switch,
    "abort_at_start": abort_at_start,
    "stop_at_start": stop_at_start,
    "continue_after_app": continue_after_app,
    "unknown_start_key": unknown_start_key,
    "big_tool_arguments": big_tool_arguments,
    "long_tool_batch": long_tool_batch,
    "abort_before_switch": abort_before_switch,
    "hook_abort": hook_abort,
    "approval_configure": approval_configure,
    "hook_approval_no_reason": hook_approval_no_reason,
    "override_flag_as_text": override_flag_as_text,
    "close_mid_run": close_mid_run,
    "reset_counters": reset_counters,
    "sequential_hook_view": sequential_hook_view,
    "counters_timer": counters_timer,
    "cleared_queues_close": cleared_queues_close,
    "cleared_queues_switched": cleared_queues_switched,
}


async def record(names: list[str]) -> None:
    server = DevServer().start()
    model_server = ScriptedModelServer().start()
    os.environ.update(
        OPENAI_BASE_URL=model_server.base_url, OPENAI_API_KEY="recording", AGENT_MODEL="scripted"
    )
    try:
        config = Settings.from_env(address=server.address, task_queue=TASK_QUEUE)
        client = await connect(config)
        # The dev server has the agent's search attributes: their upserts are recorded too.
        async with build_worker(client, config, search_attributes=True, hooks=RecordingHooks()):
            for name, scenario in SCENARIOS.items():
                if names and name not in names:
                    continue
                handle = await scenario(client, model_server, f"rec-{name}")
                if name in (
                    "continue_as_new",
                    "idle_switch",
                    "idle_waiter_at_switch",
                    "abort_before_switch",
                    "cleared_queues_switched",
                ):
                    # Every run of the chain: each is replayed on its own.
                    runs = [e async for e in client.list_workflows(f"WorkflowId = '{handle.id}'")]
                    for index, run in enumerate(sorted(runs, key=lambda r: r.start_time)):
                        history = await client.get_workflow_handle(
                            handle.id, run_id=run.run_id
                        ).fetch_history()
                        (HISTORIES / f"{name}_{index}.json").write_text(history.to_json())
                else:
                    history = await handle.fetch_history()
                    (HISTORIES / f"{name}.json").write_text(history.to_json())
                print(f"recorded {name}")
    finally:
        model_server.stop()
        server.stop()


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1:]))
    sys.stdout.flush()
    os._exit(0)
