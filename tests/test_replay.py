"""Determinism guard: every recorded history in tests/histories/ replays
against the current workflow code. A change that would break running
conversations fails here (see the README on ``workflow.patched``).

tests/histories/v1/ holds histories recorded before tool declarations were
recorded in the history: they replay on the legacy path, with the tool
registry they were recorded with. The current ones need nothing from the
worker: they replay the same on a worker whose tools differ."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import temporalio.bridge.worker as bridge_worker
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

import activities.builtin_tools  # noqa: F401  (the registry the v1 recordings saw)
import tests.support.tools  # noqa: F401
import worker as worker_module
from activities.tools import declarations, registered_tools
from runtime import payload_walk
from runtime.payloads import data_converter_from_env
from runtime.sandbox import workflow_runner
from runtime.settings import Settings
from tests.support.recording_hooks import RecordingHooks
from tests.support.stack import Stack, finished_on_own_worker
from workflows.agent import AgentWorkflow
from workflows.bindings import BindingsInterceptor, WorkflowBindings
from workflows.models import ToolDeclaration

ROOT = Path(__file__).resolve().parent / "histories"
CURRENT = sorted(ROOT.glob("*.json"))
V1 = sorted((ROOT / "v1").glob("*.json"))
# Recorded with tool declarations, before an abort answered at once (v2);
# with each patch's own marker, before one marker stood for them all (v3);
# with the first combined marker, before search attributes were refreshed
# by time (v4); with the second, before a run due to continue as new waited
# for its wait_for_idle callers (v5); with the third, before an abort or
# stop_after_turn sent before a run began applied to it (v6); with the
# fourth, before a conversation completed by closeWhenIdle was `closed` (v7);
# with the fifth, before an abort during a stopping turn's tools ended the
# run with its aborted message (v8); with the sixth, before a long tool batch
# was worked on in parts (v9); with the seventh, before the publishers of
# aborted model calls were carried across continue-as-new (v10); with the
# eighth, before a run waited for its aborted model call to end before
# continuing as new or completing (v11); with the ninth, before an abort
# ended a hook's wait (v12); with the tenth, before a call waiting for
# approval followed a configured approvalTimeoutSeconds (v13); with the
# eleventh, before a hook's RequireApproval without a reason waited for a
# person (v14: that scenario only, the patch has its own marker); before an
# override's non-bool flag was the call's error and a reset or a close
# upserted the counters at once (v15: those scenarios only); with the twelfth,
# before the thirteenth took those patches and carried-counters-time and
# start-input-safe-integers (v16: every scenario); with the thirteenth,
# before the hooks of a sequential batch saw the transcript as pi hands it
# and an abort taken at a turn boundary kept the follow-ups queued (v17:
# every scenario, sequential_hook_view on its old path); with the fourteenth,
# before the counters' upsert and an approval's deadline waited for a timer
# rather than the clock (v18: every scenario); before clear_queues completed a
# closeWhenIdle conversation an abort had left with queued messages (v19:
# that scenario only, the patch has its own marker); before the next run of
# such a conversation, continued as new while it waited, knew a run had
# ended (v20: cleared_queues_switched only, carried-run-end's own marker);
# before the worker's defaults came by a plain activity (v21: every
# scenario, defaults-by-activity's own marker; each took them by a local
# activity).
V2 = sorted((ROOT / "v2").glob("*.json")) + sorted((ROOT / "v3").glob("*.json"))
V4 = sorted((ROOT / "v4").glob("*.json"))
V5 = sorted((ROOT / "v5").glob("*.json"))
V6 = sorted((ROOT / "v6").glob("*.json"))
V7 = sorted((ROOT / "v7").glob("*.json"))
V8 = sorted((ROOT / "v8").glob("*.json"))
V9 = sorted((ROOT / "v9").glob("*.json"))
V10 = sorted((ROOT / "v10").glob("*.json"))
V11 = sorted((ROOT / "v11").glob("*.json"))
V12 = sorted((ROOT / "v12").glob("*.json"))
V13 = sorted((ROOT / "v13").glob("*.json"))
V14 = sorted((ROOT / "v14").glob("*.json"))
V15 = sorted((ROOT / "v15").glob("*.json"))
V16 = sorted((ROOT / "v16").glob("*.json"))
V17 = sorted((ROOT / "v17").glob("*.json"))
V18 = sorted((ROOT / "v18").glob("*.json"))
V19 = sorted((ROOT / "v19").glob("*.json"))
V20 = sorted((ROOT / "v20").glob("*.json"))
V21 = sorted((ROOT / "v21").glob("*.json"))


DECLARED = (
    CURRENT
    + V21
    + V20
    + V19
    + V18
    + V17
    + V16
    + V15
    + V14
    + V13
    + V12
    + V11
    + V10
    + V9
    + V8
    + V7
    + V6
    + V5
    + V4
)
"""The histories of conversations that recorded their tool declarations (v4 on)."""
RECORDED = DECLARED + V2 + V1
"""Every recorded history, newest first."""


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def _stem(path: Path) -> str:
    return path.stem.rsplit("_", 1)[0] if path.stem[-1].isdigit() else path.stem


LATEST = {"sequential_hook_view"}
"""Scenarios recorded only from v17 on (their old paths in v17)."""
NEWEST = {"counters_timer", "cleared_queues_close", "cleared_queues_switched"}
"""Scenarios first recorded by the current version: counters_timer
(clock-free-commands: a path no earlier version had),
cleared_queues_close (its old path in v19) and cleared_queues_switched
(its old path in v20)."""
LATER = {"override_flag_as_text", "close_mid_run", "reset_counters"} | LATEST
"""Scenarios recorded only from v15 on (their old paths in v15), and the latest."""


def test_there_are_recorded_histories() -> None:
    expected = {"tools", "steering_and_follow_up", "abort_and_prompt", "errors", "continue_as_new"}
    assert expected | {
        "subscriber_at_close",
        "agent_api",
        "approval",
        "idle_switch",
        "search_attributes",
        "busy_subscriber",  # holds the update waiting for the run's end
        "idle_waiter_at_switch",  # wait_for_idle during a run due to continue as new
        "abort_at_start",  # abort sent with the start (signal-with-start)
        "stop_at_start",  # stop_after_turn sent with the start
        "continue_after_app",  # a follow-up while idle after an application message
        "unknown_start_key",  # a misspelt start input key
        "big_tool_arguments",  # ~1.2 MB of tool arguments in one answer
        "long_tool_batch",  # 1,001 tool calls in one answer
        "abort_before_switch",  # an aborted call's late deltas reach the next run
        "hook_abort",  # an abort while a before_tool_call hook waits on a timer
        "approval_configure",  # approvalTimeoutSeconds configured while a call waits
        "hook_approval_no_reason",  # a hook's RequireApproval without a reason
        "override_flag_as_text",  # an after_tool_call override whose terminate is text
        "close_mid_run",  # a close while a tool runs: the counters at the end
        "reset_counters",  # a reset: the counters at once
        "sequential_hook_view",  # a hook handed its sequential batch's earlier result
        "counters_timer",  # the counters' timer fires during a long tool
        "cleared_queues_close",  # clear_queues empties a closeWhenIdle conversation's queues
        "cleared_queues_switched",  # ... after it continued as new while it waited
    } <= {_stem(p) for p in CURRENT}
    assert expected | {"subscriber_at_close"} <= {_stem(p) for p in V1}
    # Every scenario recorded before search-attributes-by-time, again (busy_subscriber came after).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        *NEWEST,
        "hook_approval_no_reason",
        "approval_configure",
        "hook_abort",
        "abort_before_switch",
        "busy_subscriber",
        "idle_waiter_at_switch",
        "abort_at_start",
        "stop_at_start",
        "continue_after_app",
        "unknown_start_key",
        "big_tool_arguments",
        "long_tool_batch",
    } <= {_stem(p) for p in V4}
    # Every scenario, recorded before the hold-switch-for-idle-waiters patch
    # too (its old path: the waiter told to ask again at each switch).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "approval_configure",
        "hook_abort",
        "abort_before_switch",
        "abort_at_start",
        "stop_at_start",
        "continue_after_app",
        "unknown_start_key",
        "big_tool_arguments",
        "long_tool_batch",
    } <= {_stem(p) for p in V5}
    # Every scenario, recorded before the abort-before-run-start,
    # continue-after-app-message and strict-start-input patches too
    # (their old paths: the early signal dropped, the run ran in full; the
    # follow-up run as the prompt; the unknown key ignored).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "approval_configure",
        "big_tool_arguments",
        "long_tool_batch",
        "abort_before_switch",
        "hook_abort",
    } <= {_stem(p) for p in V6}
    # Every scenario, recorded before the closed-when-idle and
    # tool-argument-bytes patches too (their old paths: completed by
    # closeWhenIdle, the status left `idle`; a batch's tools all scheduled at
    # once, whatever their arguments' size).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "long_tool_batch",
        "abort_before_switch",
        "hook_abort",
        "approval_configure",
    } <= {_stem(p) for p in V7}
    # Every scenario, recorded before the abort-over-stop patch too (its old
    # path changes events, not commands: tests/test_agent_loop.py runs it).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "long_tool_batch",
        "abort_before_switch",
        "hook_abort",
        "approval_configure",
    } <= {_stem(p) for p in V8}
    # Every scenario, recorded before the tool-batch-in-parts patch too (its
    # old path: all 1,001 calls of long_tool_batch in one workflow task).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "abort_before_switch",
        "hook_abort",
        "approval_configure",
    } <= {_stem(p) for p in V9}
    # Every scenario, recorded before drop-carried-publishers too (its old
    # path: the late deltas published in the next run).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "abort_before_switch",
        "hook_abort",
        "approval_configure",
    } <= {_stem(p) for p in V10}
    # Every scenario, recorded before await-aborted-model-call too (its old
    # path: abort_before_switch continued as new before its call ended).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "hook_abort",
        "approval_configure",
    } <= {_stem(p) for p in V11}
    # Every scenario, recorded before abortable-hooks too (its old path:
    # hook_abort's abort waited for the hook's timer to fire).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {
        *LATER,
        "hook_approval_no_reason",
        "approval_configure",
    } <= {_stem(p) for p in V12}
    # Every scenario, recorded before approval-timeout-follows-configure too
    # (its old path: approval_configure's call waited on and was approved).
    assert ({_stem(p) for p in CURRENT} - NEWEST) - {*LATER, "hook_approval_no_reason"} <= {
        _stem(p) for p in V13
    }
    # Recorded before approval-without-reason (its old path: the call ran unasked).
    assert {_stem(p) for p in V14} == {"hook_approval_no_reason"}
    # Recorded before strict-override-flags and search-attribute-counters-now
    # (their old paths: the text's truth ended the run; the counters left behind).
    assert {_stem(p) for p in V15} == LATER - LATEST
    # Every scenario, recorded with the twelfth combined marker (agent-2026-12-k).
    assert {_stem(p) for p in V16} == ({_stem(p) for p in CURRENT} - NEWEST) - LATEST
    # Every scenario, recorded with the thirteenth (agent-2026-12-l), and the
    # old path of hooks-see-batch-start (the hook saw the result and blocked).
    assert {_stem(p) for p in V17} == ({_stem(p) for p in CURRENT} - NEWEST)
    # Every scenario, recorded with the fourteenth (agent-2026-12-m): the
    # counters and approval deadlines decided by the clock.
    assert {_stem(p) for p in V18} == ({_stem(p) for p in CURRENT} - NEWEST)
    # Recorded before cleared-queues-complete (its old path: open until a close).
    assert {_stem(p) for p in V19} == {"cleared_queues_close"}
    # Recorded before carried-run-end (its old path: the next run open until its own run ended).
    assert {_stem(p) for p in V20} == {"cleared_queues_switched"}
    # Every scenario, recorded before defaults-by-activity (a local activity's marker in each).
    assert {_stem(p) for p in V21} == {_stem(p) for p in CURRENT}


async def replay(path: Path, legacy_tools: dict[str, ToolDeclaration]) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(
        workflows=[AgentWorkflow],
        data_converter=data_converter_from_env(),
        workflow_runner=workflow_runner(),  # the worker's sandbox
        # RecordingHooks: the recording worker's (they act in hook_abort only).
        interceptors=[
            BindingsInterceptor(WorkflowBindings(legacy_tools=legacy_tools, hooks=RecordingHooks()))
        ],
    )
    await replayer.replay_workflow(history)


@pytest.mark.parametrize("path", RECORDED, ids=_ids(RECORDED))
async def test_recorded_history_replays(path: Path) -> None:
    await replay(path, {d.name: d for d in declarations(registered_tools())})


@pytest.mark.parametrize("path", DECLARED, ids=_ids(DECLARED))
async def test_current_histories_replay_on_a_worker_with_other_tools(path: Path) -> None:
    """The worker lacks `echo` and declares `sequential_echo` parallel: a
    conversation that recorded its declarations does not care."""
    changed = {d.name: d for d in declarations(registered_tools()) if d.name != "echo"}
    changed["sequential_echo"] = changed["sequential_echo"].model_copy(update={"execution_mode": "parallel"})
    await replay(path, changed)


async def test_the_tools_recording_holds_the_declarations_it_decided_by() -> None:
    """It recorded `echo` and a sequential `sequential_echo` in its
    session_defaults activity's result (v21: its local activity's marker)
    and called both, so the test above would fail if the workflow read the
    worker's (changed) tools."""
    history = WorkflowHistory.from_json("tools", (ROOT / "tools.json").read_text())
    converter = data_converter_from_env()
    declared: dict[str, dict[str, object]] = {}
    scheduled = 0
    for event in history.events:
        recorded = []
        if event.HasField("marker_recorded_event_attributes"):
            recorded = list(event.marker_recorded_event_attributes.details.values())
        if event.HasField("activity_task_completed_event_attributes"):
            recorded = [event.activity_task_completed_event_attributes.result]
        for payloads in recorded:
            for value in await converter.decode(list(payloads.payloads)):
                if isinstance(value, dict) and "tools" in value:
                    declared = {t["name"]: t for t in value["tools"]}
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled += event.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool"
    assert declared["sequential_echo"]["executionMode"] == "sequential" and "echo" in declared
    assert scheduled >= 3


async def test_a_legacy_history_does_depend_on_the_workers_tools() -> None:
    """The control: a v1 recording (before declarations were recorded) does
    not replay on the changed worker, so the test above can fail."""
    changed = {d.name: d for d in declarations(registered_tools()) if d.name != "echo"}
    with pytest.raises(Exception, match=r"[Nn]ondetermin"):
        await replay(ROOT / "v1" / "tools.json", changed)


@contextlib.contextmanager
def _walk_kept() -> Iterator[None]:
    """Put the process's payload walk back as it was (on, or off for a run
    with AGENT_PAYLOAD_WALK=off or the fallbacks)."""
    was = bridge_worker.decode_activation is payload_walk.decode_activation
    try:
        yield
    finally:
        payload_walk.install(was)


async def _finished_with_fallbacks(
    stack: Stack, worker_env: dict[str, str], fallbacks: str
) -> WorkflowHistory:
    """A finished one-answer conversation's history, on a worker with
    AGENT_SDK_FALLBACKS ``fallbacks``."""
    queue = f"fallbacks-{fallbacks}-{uuid.uuid4().hex[:6]}"
    stack.script({"text": "hello"})
    with _walk_kept():
        settings = Settings.from_env({**worker_env, "AGENT_SDK_FALLBACKS": fallbacks}, task_queue=queue)
        handle, _, _ = await finished_on_own_worker(stack, settings, "hi")
    return await handle.fetch_history()


def _has_timer(history: WorkflowHistory) -> bool:
    """A timer other than the one the counters' upsert waits for (the linger's)."""
    return any(
        e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and b"counters" not in e.user_metadata.summary.data
        for e in history.events
    )


async def _replay_on(history: WorkflowHistory, *, fallbacks: bool) -> None:
    """Replay as a worker with or without the fallbacks would: its
    bindings, and each of its sandboxes and payload walks."""
    with _walk_kept():
        for walk in (True, False):  # the worker's payload walk, and the SDK's own passes
            payload_walk.install(walk)
            for precompile in (True, False):  # the worker's sandbox, and the stock one
                await Replayer(
                    workflows=[AgentWorkflow],
                    data_converter=data_converter_from_env(),
                    workflow_runner=workflow_runner(precompile=precompile),
                    interceptors=[BindingsInterceptor(WorkflowBindings(track_subscribers=not fallbacks))],
                ).replay_workflow(history)


async def test_a_conversation_replays_alike_on_workers_with_and_without_the_sdk_fallbacks(
    stack: Stack, worker_env: dict[str, str]
) -> None:
    """AGENT_SDK_FALLBACKS decides how a completing conversation waits for
    its subscribers (a plain timer, or none once they have all read): the
    conversation records the choice when it starts, so a worker with the
    other setting replays it as it ran (18 of 24 recorded histories failed)."""
    for fallbacks in ("on", "off"):
        history = await _finished_with_fallbacks(stack, worker_env, fallbacks)
        assert _has_timer(history) is (fallbacks == "on"), "the setting decides a command"
        await _replay_on(history, fallbacks=True)
        await _replay_on(history, fallbacks=False)


async def test_a_conversation_that_recorded_no_choice_replays_as_its_workers_setting_says(
    stack: Stack, worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One started before the choice was recorded (its session_defaults
    without it) lingered as its worker's setting said, and replays so: on
    a worker with the same setting, as before (a review found the first
    version read it as tracked, failing every such fallback history)."""

    class RecordingNoChoice(worker_module.SessionActivities):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._defaults = self._defaults.model_copy(update={"track_subscribers": None})

    monkeypatch.setattr(worker_module, "SessionActivities", RecordingNoChoice)
    history = await _finished_with_fallbacks(stack, worker_env, "on")
    assert _has_timer(history)
    await _replay_on(history, fallbacks=True)
    with pytest.raises(Exception, match=r"[Nn]ondetermin"):
        await _replay_on(history, fallbacks=False)


def _approvals_and_markers(path: Path) -> tuple[list[str], list[str]]:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    updates = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    markers = [
        b" ".join(
            p.data for v in e.marker_recorded_event_attributes.details.values() for p in v.payloads
        ).decode(errors="replace")
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]
    return updates, markers


def test_a_hooks_approval_without_reason_waits_for_a_person_from_its_patch_on() -> None:
    """Recorded before approval-without-reason, the call ran unasked; since,
    the run records that patch's marker and the call waits for approve_tool
    (a hook that asks for a person must never be let through)."""
    before = _approvals_and_markers(ROOT / "v14" / "hook_approval_no_reason.json")
    since = _approvals_and_markers(ROOT / "hook_approval_no_reason.json")

    assert "approve_tool" not in before[0] and not any("approval-without-reason" in m for m in before[1])
    assert "approve_tool" in since[0] and any("approval-without-reason" in m for m in since[1])


async def test_a_run_of_the_release_before_continuing_this_releases_carry_replays(tmp_path: Path) -> None:
    """A rollout: this release's run ended aborted with a follow-up queued
    and continued as new, carrying ``runEnded``; a worker of the release
    before took the next run, which stayed open after ``clear_queues`` (it
    reads no ``runEnded``) and took a prompt. This release must replay that
    run as it ran (an upgrade audit found it failing every workflow task
    with a nondeterminism error until a worker of the old release took it).
    The run is v20's recording of that path, its carry given ``runEnded``
    as this release writes it."""
    recorded = ROOT / "v20" / "cleared_queues_switched_1.json"
    history = json.loads(recorded.read_text())
    payload = history["events"][0]["workflowExecutionStartedEventAttributes"]["input"]["payloads"][0]
    assert base64.b64decode(payload["metadata"]["encoding"]) == b"binary/zlib"
    inner = Payload()
    inner.ParseFromString(zlib.decompress(base64.b64decode(payload["data"])))
    start = json.loads(inner.data)
    assert "runEnded" not in start["carry"]  # written by the release before
    start["carry"]["runEnded"] = True
    inner.data = json.dumps(start).encode()
    payload["data"] = base64.b64encode(zlib.compress(inner.SerializeToString())).decode()
    mixed = tmp_path / "cleared_queues_switched_mixed.json"
    mixed.write_text(json.dumps(history))
    await replay(mixed, {d.name: d for d in declarations(registered_tools())})


async def test_a_new_conversation_takes_the_workers_defaults_by_a_plain_activity(stack: Stack) -> None:
    """Not a local activity in its first workflow task: a `state` query
    answered while that task ran made the SDK's core hand the activity's
    result to the workflow a task late, after the updates (a subscriber's
    reads) that came meanwhile, and the history it recorded failed every
    replay (3 in 10 conversations queried and read at once, in a contract
    audit). Under its own marker: a run of the release before replays its
    local activity (tests/histories/v21)."""
    conversation = await stack.conversation()
    handle = stack.client.get_workflow_handle(conversation.id)

    async def first_steps() -> list[Any]:
        for _ in range(100):
            events = [e async for e in handle.fetch_history_events()]
            if any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED for e in events):
                return events
            await asyncio.sleep(0.05)
        raise AssertionError("the defaults' activity did not complete")

    events = await first_steps()
    await conversation.close()
    markers = [
        e.marker_recorded_event_attributes for e in events if e.HasField("marker_recorded_event_attributes")
    ]
    assert "core_local_activity" not in {m.marker_name for m in markers}
    patches = [json.loads(m.details["patch-data"].payloads[0].data)["id"] for m in markers]
    assert "defaults-by-activity" in patches, patches
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled == ["session_defaults"]
