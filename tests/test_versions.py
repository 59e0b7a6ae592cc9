"""The workflow's version gates (workflows/versions.py) and the worker's
bindings (workflows/bindings.py) as the workflow uses them, without a
server: which patches a run has by the marker it recorded, what a new run
records, and the bindings' argument shims, declarations and gates handed to
the loop. Behaviours a mutation audit found no test pinned (the replay test
misses a gate whose old path differs in events or state, not commands)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio import workflow
from temporalio.exceptions import ActivityError

import workflows.agent as agent_module
from tests.support.fake_loop import say
from tests.test_handlers import session, shell
from workflows.agent import AgentWorkflow
from workflows.bindings import WorkflowBindings
from workflows.calls import ActivityCalls
from workflows.contract import SessionCarry, SessionSettings
from workflows.models import TextContent, ToolCall, ToolDeclaration
from workflows.session import Session
from workflows.versions import CURRENT, PREVIOUS, Versions

FIRST = {
    "recorded-tool-declarations",
    "wait-for-cancelled-tools",
    "instant-abort",
    "idle-switch",
    "linger-for-subscribers",
    "search-attributes",
    "no-switch-while-aborting",
}
B = FIRST | {"search-attributes-by-time"}
C = B | {"hold-switch-for-idle-waiters"}
D = C | {"abort-before-run-start", "strict-start-input", "continue-after-app-message"}
E = D | {"closed-when-idle", "tool-argument-bytes", "stream-events-as-pi"}
F = E | {"abort-over-stop"}
G = F | {"tool-batch-in-parts"}
H = G | {"drop-carried-publishers"}
I = H | {"await-aborted-model-call"}  # noqa: E741
J = I | {"abortable-hooks"}
K = J | {"approval-timeout-follows-configure"}
L = K | {
    "strict-override-flags",
    "search-attribute-counters-now",
    "carried-counters-time",
    "start-input-safe-integers",
}
M = L | {
    "approval-without-reason",
    "hooks-see-batch-start",
    "abort-before-follow-ups",
    "carry-not-retried",
    "save-local-results-before-switch",
}
RECORDED_MARKERS = {
    "agent-2026-12": FIRST,
    "agent-2026-12-b": B,
    "agent-2026-12-c": C,
    "agent-2026-12-d": D,
    "agent-2026-12-e": E,
    "agent-2026-12-f": F,
    "agent-2026-12-g": G,
    "agent-2026-12-h": H,
    "agent-2026-12-i": I,
    "agent-2026-12-j": J,
    "agent-2026-12-k": K,
    "agent-2026-12-l": L,
    "agent-2026-12-m": M,
}
"""What each combined marker stood for when runs recorded it (histories in
tests/histories/v4..v18): fixed for good, whatever later versions add."""
LATER = {"clock-free-commands"}
EVERY_PATCH = M | LATER


@pytest.fixture
def markers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[set[str] | None], list[str]]]:
    """``workflow.patched`` as in a replay of a history holding the given
    markers (None: a new run, where every patch is recorded); returns the
    list of the ids asked."""

    def use(recorded: set[str] | None) -> list[str]:
        asked: list[str] = []

        def patched(patch_id: str) -> bool:
            asked.append(patch_id)
            return recorded is None or patch_id in recorded

        monkeypatch.setattr(workflow, "patched", patched)
        return asked

    yield use


def test_a_new_run_records_only_the_current_marker(markers: Any) -> None:
    """A run started by this version pays for one marker, then takes every new path without asking."""
    asked = markers(None)
    versions = Versions()
    versions.start()
    assert all(versions.has(p) and versions.marked(p) for p in EVERY_PATCH)
    assert asked == [CURRENT] and versions.current


@pytest.mark.parametrize("marker", sorted(RECORDED_MARKERS))
def test_a_run_that_recorded_an_earlier_marker_has_exactly_the_patches_it_stood_for(
    marker: str, markers: Any
) -> None:
    """An open conversation started by an earlier version replays on the paths it took then."""
    markers({marker})
    versions = Versions()
    versions.start()
    assert not versions.current
    assert {p for p in EVERY_PATCH if versions.has(p)} == RECORDED_MARKERS[marker]
    assert {p for p in EVERY_PATCH if versions.marked(p)} == RECORDED_MARKERS[marker]
    assert set(PREVIOUS) == set(RECORDED_MARKERS)


def test_marked_asks_no_marker_and_is_false_before_start(markers: Any) -> None:
    """A signal handler (before ``run`` starts, or of an old run) reads the gate without a command."""
    asked = markers({"agent-2026-12-g"})
    versions = Versions()
    assert not any(versions.marked(p) for p in EVERY_PATCH)
    versions.start()
    asked.clear()
    assert not versions.marked("drop-carried-publishers") and versions.marked("tool-batch-in-parts")
    assert asked == []


def _prepared_by(shims: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    wf = shell(session())
    wf._bindings = WorkflowBindings(argument_shims=shims)
    return wf._prepare_arguments(call)


def test_a_tools_argument_shim_prepares_its_own_calls_only() -> None:
    """``prepare_arguments`` of a tool rewrites the raw arguments of calls to that tool, no other."""
    shims = {"echo": lambda args: {"text": args.pop("msg")}}
    assert _prepared_by(shims, ToolCall(id="c1", name="echo", arguments={"msg": "hi"})) == {"text": "hi"}
    assert _prepared_by(shims, ToolCall(id="echo", name="other", arguments={"msg": "hi"})) == {"msg": "hi"}


def test_an_argument_shim_that_changes_its_input_leaves_the_transcripts_call_as_the_model_sent_it() -> None:
    """The assistant message keeps the model's arguments (the shim gets a copy)."""
    call = ToolCall(id="c1", name="echo", arguments={"msg": "hi"})
    _prepared_by({"echo": lambda args: args.update(text=args.pop("msg")) or args}, call)
    assert call.arguments == {"msg": "hi"}


def test_an_argument_shim_that_returns_no_dict_fails_the_call_with_a_sentence() -> None:
    """A shim returning a list is named in the call's error, not passed on to validation."""
    with pytest.raises(TypeError, match=r"^prepare_arguments of echo returned list, not a dict$"):
        _prepared_by({"echo": lambda args: [args]}, ToolCall(id="c1", name="echo", arguments={}))


def _loop_config_with(has: Callable[[str], bool]) -> Any:
    wf = shell(session())
    wf._bindings = WorkflowBindings()
    wf._versions = SimpleNamespace(has=has)  # type: ignore[assignment]
    wf._calls = SimpleNamespace(stream_assistant_response=None, execute_tool=None)  # type: ignore[assignment]
    return AgentWorkflow._loop_config(wf)


def test_the_loop_ends_an_aborted_stopping_turn_as_its_run_recorded() -> None:
    """abort-over-stop only for runs that have it: an older run's messages replay as they were."""
    assert _loop_config_with(lambda p: p == "abort-over-stop").abort_over_stop()
    assert not _loop_config_with(lambda p: p != "abort-over-stop").abort_over_stop()


def test_the_loop_emits_a_failed_runs_turn_end_as_its_run_recorded() -> None:
    """stream-events-as-pi only for runs that have it: an older run's events replay as they were."""
    assert _loop_config_with(lambda p: p == "stream-events-as-pi").failure_turn_end()
    assert not _loop_config_with(lambda p: p != "stream-events-as-pi").failure_turn_end()


def test_state_before_the_first_task_lists_the_workers_tools() -> None:
    """A `state` query right after the start names the tools this worker would record."""
    s = Session(SessionSettings(), [], SessionCarry(), lambda: 1)
    wf = shell(s)
    wf._stream = SimpleNamespace(offset=lambda: 0)  # type: ignore[assignment]
    wf._calls = SimpleNamespace(streaming=False)  # type: ignore[assignment]
    wf._bindings = WorkflowBindings(legacy_tools={"echo": ToolDeclaration(name="echo")}, default_model="m")
    state = wf.state()
    assert (state.tools, state.model) == (["echo"], "m")


def test_a_conversation_carries_its_recorded_subscriber_tracking_into_the_next_run() -> None:
    """The choice recorded at the start holds after continue-as-new, on a worker of either setting."""
    for recorded in (False, True):
        s = Session(SessionSettings(), [], SessionCarry(track_subscribers=recorded), lambda: 1)
        assert s.carry(None, closed_publishers=[]).track_subscribers is recorded


def test_late_events_of_an_aborted_call_are_dropped_after_a_switch_only_by_runs_that_have_the_patch(
    markers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started before drop-carried-publishers still publishes them, as its subscribers saw."""
    monkeypatch.setattr(
        workflow, "info", lambda: SimpleNamespace(continued_run_id=None, attempt=1, cron_schedule=None)
    )
    monkeypatch.setattr(agent_module, "EventStream", lambda *_: SimpleNamespace(track=lambda: None))
    for marker, dropped in (("agent-2026-12-g", False), ("agent-2026-12-h", True), (CURRENT, True)):
        markers({marker})
        wf = AgentWorkflow({})
        assert not wf._stream.drop_carried()  # before `run` starts: no marker read yet
        wf._versions.start()
        assert wf._stream.drop_carried() is dropped


def _calls_with(has: Callable[[str], bool], asked: list[Any]) -> ActivityCalls:
    """Model calls of a session whose stream had streamed ``partial``."""
    calls = object.__new__(ActivityCalls)
    calls._session = session()
    calls._now_ms = lambda: 1
    calls._versions = SimpleNamespace(has=has)  # type: ignore[assignment]
    calls._instant_abort = True
    calls._llm = None
    calls.on_change = lambda: None

    def streamed_message(**kwargs: Any) -> Any:
        asked.append(kwargs)
        return say("partial")

    calls._stream = SimpleNamespace(  # type: ignore[assignment]
        streamed_message=streamed_message, model_call_started=lambda: None, model_call_ended=lambda **_: None
    )
    return calls


def test_an_aborted_answer_retries_dropped_deltas_only_for_runs_that_have_stream_events_as_pi() -> None:
    """An older run's aborted message is rebuilt from the stream as it was when it ran."""
    for has, retry in (
        (lambda p: p == "stream-events-as-pi", True),
        (lambda p: p != "stream-events-as-pi", False),
    ):
        asked: list[Any] = []
        _calls_with(has, asked)._aborted_answer()
        assert asked == [{"retry_drops": retry}]


async def test_a_failed_model_call_keeps_its_partial_text_only_in_runs_with_stream_events_as_pi() -> None:
    """An older run's error message replays without the partial text it never had."""
    failure = ActivityError(
        "failed",
        scheduled_event_id=1,
        started_event_id=2,
        identity="w",
        activity_type="llm",
        activity_id="1",
        retry_state=None,
    )
    texts = []
    for has in (lambda p: p == "stream-events-as-pi", lambda p: p != "stream-events-as-pi"):
        calls = _calls_with(has, [])

        async def call_model(_context: Any) -> Any:
            raise failure

        calls._call_model = call_model  # type: ignore[method-assign, assignment]
        context: Any = SimpleNamespace(messages=[], tools=None)
        answer = await calls.stream_assistant_response(context)
        texts.append([c.text for c in answer.message.content if isinstance(c, TextContent)])
    assert texts == [["partial"], []]


async def _model_after_recording_defaults(recorded_tools: bool, model: str | None) -> str | None:
    s = Session(SessionSettings(model=model), [], SessionCarry(), lambda: 1)
    wf = shell(s)
    wf._versions = SimpleNamespace(has=lambda p: recorded_tools and p == "recorded-tool-declarations")  # type: ignore[assignment]
    wf._bindings = WorkflowBindings(legacy_tools={"echo": ToolDeclaration(name="echo")})

    async def session_defaults() -> Any:
        return SimpleNamespace(
            tools=[], search_attributes=False, track_subscribers=True, model="worker-model"
        )

    wf._calls = SimpleNamespace(session_defaults=session_defaults)  # type: ignore[assignment]
    await wf._record_worker_defaults()
    return s.settings.model


async def test_a_legacy_conversation_without_a_model_gets_the_workers_default() -> None:
    """The legacy path (the worker's tools) still records a default model for a run started without one."""
    assert await _model_after_recording_defaults(False, None) == "worker-model"
    assert await _model_after_recording_defaults(False, "mine") == "mine"


@pytest.mark.parametrize("seconds_since_upsert", [1, 20])
def test_whether_the_counters_upsert_does_not_hang_on_the_clock(
    seconds_since_upsert: int, markers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker taking a run over read the previous workflow task's time
    while the task ran; a replay of the task reads its own. The counters'
    upsert was decided by comparing that time with the last upsert's: due in
    the replay only, it failed every later workflow task (nondeterminism: a
    crash audit's conversation wedged for good). Now the counters wait for a
    timer, whichever time the task reads: the same commands either way."""
    markers(None)  # a run of this version
    wf = shell(session())
    wf._versions = Versions()
    wf._versions.start()
    wf._counters_timer, wf._counters_due, wf._counters_clock_read = None, False, False
    wf._session.search_attributes = True
    wf._session.published = {**wf._session.search_attribute_values(), "AgentTurns": 0}
    last = datetime(2026, 12, 7, tzinfo=UTC)
    wf._session.published_at = last
    monkeypatch.setattr(workflow, "now", lambda: last + timedelta(seconds=seconds_since_upsert))
    upserts: list[Any] = []
    monkeypatch.setattr(workflow, "upsert_search_attributes", upserts.append)
    timers: list[timedelta] = []

    def start_timer(self: AgentWorkflow, now: datetime) -> None:
        timers.append(now - last)

    monkeypatch.setattr(AgentWorkflow, "_start_counters_timer", start_timer)
    wf._session.turns.total = 3  # a turn ended: the counters changed
    wf._sync_search_attributes()
    assert upserts == [] and timers == [timedelta(seconds=seconds_since_upsert)]
    # Once its timer has fired, they are upserted.
    wf._counters_due = True
    wf._sync_search_attributes()
    assert len(upserts) == 1 and not wf._counters_due
