"""The session workflow's public handlers (SPEC 6-9): their validators'
refusals and what the handlers and queries answer, most without a server
(validators and queries called on a workflow object holding a session),
the rest through the dev server: behaviours a mutation audit found no test
pinned. Each test fails on its mutant of workflows/agent.py or session.py."""

from __future__ import annotations

import asyncio
import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.exceptions import ApplicationError

from tests.support.fake_loop import say, user
from tests.support.stack import EventLog, Stack
from tests.test_agent_api import running_a_slow_tool
from workflows.agent import AgentWorkflow
from workflows.contract import PendingApproval, PendingRun, SessionCarry, SessionSettings
from workflows.models import RunState
from workflows.session import Session


def session(**settings: Any) -> Session:
    """A session idle after an answer."""
    return Session(SessionSettings(**settings), [user("hi"), say("hello")], SessionCarry(), lambda: 1)


def shell(s: Session) -> AgentWorkflow:
    """The workflow object around ``s``, enough for its validators."""
    wf = object.__new__(AgentWorkflow)
    wf._session = s
    wf._now_ms = lambda: 1  # type: ignore[method-assign]
    wf._update_details = lambda: None  # type: ignore[method-assign]
    return wf


@pytest.fixture
def quiet_workflow_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    """``workflow.logger`` outside a workflow (it asks the workflow whether it replays)."""
    monkeypatch.setattr(workflow, "logger", logging.getLogger("audit"))


def refusal_of(validator: Any, *args: Any) -> str:
    with pytest.raises(ApplicationError) as err:
        validator(*args)
    assert err.value.type == "InvalidInput" and err.value.non_retryable
    return err.value.message


def running(s: Session) -> Session:
    s.run = RunState(started_at_message=len(s.messages))
    return s


# --- prompt and continue ------------------------------------------------------------------


@pytest.mark.parametrize("update", ["prompt", "continue"])
def test_a_run_asked_for_after_close_is_refused_with_a_sentence(update: str) -> None:
    """After `close`, `prompt` and `continue` say the conversation is closed instead of starting a run."""
    s = session()
    s.enqueue(s.follow_up, user("queued"))
    s.pending, s.closing = None, True
    wf = shell(s)
    validator, args = (wf._validate_prompt, ("hi",)) if update == "prompt" else (wf._validate_continue, ())
    assert refusal_of(validator, *args) == "The conversation is closed: start a new one."


# --- continue ------------------------------------------------------------------------


def test_continue_while_a_run_is_active_is_refused() -> None:
    """`continue` during a run is refused (its plan would replace the run's), as `prompt` is."""
    s = running(session())
    s.enqueue(s.follow_up, user("later"))
    assert "A run is already active" in refusal_of(shell(s)._validate_continue)


def test_continue_with_nothing_queued_after_an_answer_is_refused_before_it_is_accepted() -> None:
    """The refusal comes from the validator: nothing is written to the history."""
    assert "nothing is queued" in refusal_of(shell(session())._validate_continue)


# --- reset -----------------------------------------------------------------------------


def test_reset_after_close_is_refused_with_a_sentence() -> None:
    """A closed conversation keeps its transcript: `reset` is refused, not applied."""
    s = session()
    s.closing = True
    assert refusal_of(shell(s)._validate_reset) == "The conversation is closed: start a new one."


# --- steer and follow_up ---------------------------------------------------------------


@pytest.mark.usefixtures("quiet_workflow_logger")
@pytest.mark.parametrize("signal", ["steer", "follow_up"])
def test_a_message_sent_after_close_is_dropped_and_starts_no_run(signal: str) -> None:
    """`close` ends the conversation: a steer or follow-up behind it queues nothing, starts nothing."""
    s = session()
    s.closing = True
    getattr(shell(s), signal)("one more thing")
    assert len(s.steering) == len(s.follow_up) == 0 and s.pending is None


async def test_a_steer_during_a_run_shows_in_the_ui_details_at_once(stack: Stack) -> None:
    """The Temporal UI's current details count queued messages as they arrive, not at the next tool end."""
    handle, log = await running_a_slow_tool(stack, seconds=4.0)
    await handle.signal("steer", "also this")
    assert "queued: 1 steering, 0 follow-up" in await details_before_the_tool_ends(handle, log, "queued: 1")
    log.close()
    await handle.signal("abort")
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")


async def details(handle: Any) -> str:
    """The Temporal UI's "current details" of the conversation."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def details_before_the_tool_ends(handle: Any, log: EventLog, text: str) -> str:
    """The UI details once they show ``text``, which must be before the
    running tool ends (at its end the queued steer is taken). A signal is
    applied by the next workflow task, and a query may be answered before
    it: on the dev server, a task a signal schedules just after another
    completes sometimes waits on the sticky queue for its schedule-to-start
    timeout (1 s, worker.py), about one run in twenty."""
    while True:
        ended = any(e["type"] == "tool_execution_end" for e in log.events)
        shown = await details(handle)
        if text in shown:
            return shown
        assert not ended, f"the tool ended before the details showed {text!r}: {shown!r}"
        await asyncio.sleep(0.05)


async def test_clearing_the_queues_during_a_run_shows_in_the_ui_details_at_once(stack: Stack) -> None:
    """After clear_queues the UI's queue counts read zero at once, not at the next tool end."""
    handle, log = await running_a_slow_tool(stack, seconds=4.0)
    await handle.signal("steer", "also this")
    await details_before_the_tool_ends(handle, log, "queued: 1 steering")
    log.close()
    await handle.execute_update("clear_queues", "all")
    assert "queued: 0 steering, 0 follow-up" in await details(handle)
    await handle.signal("abort")
    await handle.execute_update("wait_for_idle")
    await handle.signal("close")


async def test_a_model_configured_while_idle_shows_in_the_ui_details_at_once(stack: Stack) -> None:
    """An idle conversation's UI details name the model just configured, not the one before."""
    stack.script({"text": "hi"})
    handle = await stack.start(prompt="hello")
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("configure", {"model": f"{stack.model}-b"})
    assert f"model `{stack.model}-b`" in await details(handle)
    await handle.signal("close")


# --- configure ---------------------------------------------------------------------------


async def test_configure_before_the_tools_are_recorded_still_refuses_an_unknown_tool(
    client: Client, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configure sent with the start waits for the worker's declarations, then refuses a tool it lacks."""
    from temporalio import activity

    from activities.session import SessionActivities
    from runtime.settings import Settings
    from worker import build_worker

    release = asyncio.Event()

    @activity.defn(name="session_defaults")
    async def slow_defaults(self: Any) -> Any:
        await asyncio.wait_for(release.wait(), 30)
        return self._defaults

    monkeypatch.setattr(SessionActivities, "session_defaults", slow_defaults)
    queue = f"agent-configure-start-{uuid.uuid4().hex[:6]}"
    async with build_worker(client, Settings.from_env(worker_env, task_queue=queue)):
        handle = await client.start_workflow(
            "AgentWorkflow", {}, id=f"configure-start-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        update = await handle.start_update(
            "configure", {"tools": ["teleport"]}, wait_for_stage=WorkflowUpdateStage.ACCEPTED
        )
        release.set()
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await update.result()
        assert "Unknown tool(s) teleport" in str(refused.value.cause)
        assert "teleport" not in (await handle.query("state", result_type=dict))["tools"]
        await handle.signal("close")


async def test_after_reset_the_model_is_sent_only_the_new_transcript(stack: Stack) -> None:
    """`reset` clears the transcript for the model too: the next call carries nothing from before it."""
    stack.script({"text": "noted"}, {"text": "fresh answer"})
    handle = await stack.start(prompt="my secret is 1234")
    await handle.execute_update("wait_for_idle")
    await handle.execute_update("reset")
    await handle.execute_update("prompt", "what is my secret?")
    await handle.execute_update("wait_for_idle")
    sent = str(stack.requests()[-1]["messages"])
    assert "what is my secret?" in sent and "1234" not in sent and "noted" not in sent
    await handle.signal("close")


# --- clear_queues ------------------------------------------------------------------------


def test_clearing_empty_queues_keeps_a_prompt_accepted_but_not_begun() -> None:
    """Only the run queued messages would start is dropped with them, never a prompted one."""
    s = session()
    s.pending = PendingRun(prompts=[user("go")])
    assert s.clear_queues("all") == []
    assert s.pending is not None and [m.content for m in s.pending.prompts] == ["go"]


# --- state ---------------------------------------------------------------------------------


def test_state_is_not_streaming_while_a_prompt_is_accepted_but_its_run_not_begun() -> None:
    """SPEC 8: isStreaming spans agent_start to agent_end; the status already says running."""
    s = session()
    s.pending = PendingRun(prompts=[user("go")])
    state = s.state(0, None)
    assert state.status == "running" and state.is_streaming is False
    running(s)
    assert s.state(0, None).is_streaming is True


def test_state_says_closed_once_close_arrives_even_while_calls_await_approval() -> None:
    """`close` is the last word: status (and AgentStatus) read `closed`, not `awaiting-approval`."""
    s = running(session())
    s.approvals["c1"] = PendingApproval(tool_call_id="c1", tool_name="guarded_echo", args={}, reason="ask")
    assert s.state(0, None).status == "awaiting-approval"
    s.closing = True
    assert s.state(0, None).status == "closed"
    assert s.search_attribute_values()["AgentStatus"] == "closed"


# --- wait_for_idle ---------------------------------------------------------------------


async def test_a_caller_waiting_for_idle_is_let_go_when_the_run_must_switch_mid_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that must continue as new mid-run (past half the signal limit)
    waits for its handlers: the waiting caller is let go then and told to ask
    again (ContinuedAsNew), neither kept (the switch, and the conversation,
    would wait for it) nor answered while the run is still busy."""
    wf = shell(running(session()))
    wf._idle_waiters, wf._switching = 0, False
    seen: list[tuple[bool, int]] = []

    async def wait_condition(done: Any) -> None:
        seen.append((done(), wf._idle_waiters))
        wf._switching = True  # the run reached a turn boundary it must switch at
        seen.append((done(), wf._idle_waiters))

    monkeypatch.setattr(workflow, "wait_condition", wait_condition)
    with pytest.raises(ApplicationError) as told:
        await wf.wait_for_idle()
    assert seen == [(False, 1), (True, 1)]
    assert told.value.type == "ContinuedAsNew" and wf._idle_waiters == 0


def test_state_names_the_workers_default_model_only_while_the_conversation_may_record_it() -> None:
    """Before the first task records a model `state` names the worker's default; a conversation
    closed before recording one says null, not the default of whichever worker answers the query."""
    s = session()
    wf = shell(s)
    wf._stream = SimpleNamespace(offset=lambda: 7)
    wf._calls = SimpleNamespace(streaming=False)
    wf._bindings = SimpleNamespace(default_model="worker-default", legacy_tools={})
    state = wf.state()
    assert (state.model, state.event_offset) == ("worker-default", 7)
    s.closing = True
    assert wf.state().model is None
