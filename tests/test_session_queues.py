"""The session's queues and ``continue`` plan, without a server (SPEC 3,
6 and 8): behaviours a mutation audit found only the conformance tests
touched, or none."""

from __future__ import annotations

from typing import Any

from tests.support.fake_loop import calls, say, user
from workflows.contract import AgentSettings, SessionCarry, SessionSettings
from workflows.models import (
    AgentEndEvent,
    AssistantMessage,
    Cost,
    MessageEndEvent,
    ToolExecutionStartEvent,
    ToolResultMessage,
    TurnEndEvent,
    Usage,
)
from workflows.queues import MessageQueue
from workflows.session import Session


def session(**settings: Any) -> Session:
    """A session idle after an answer."""
    return Session(SessionSettings(**settings), [user("hi"), say("hello")], SessionCarry(), lambda: 1)


def test_continue_after_an_answer_drains_steering_before_follow_up() -> None:
    """SPEC 3 ``continue()``: drain the steering queue and run what it gave
    as prompts (skipping the initial steering poll); else the follow-up queue."""
    s = session()
    s.enqueue(s.follow_up, user("follow"))
    s.enqueue(s.steering, user("steer"))
    plan = s.continue_plan()
    assert [m.content for m in plan.prompts] == ["steer"] and plan.queue == "steering"
    assert plan.skip_initial_steering
    assert len(s.follow_up) == 1


def test_continue_from_the_follow_up_queue_says_so() -> None:
    s = session()
    s.enqueue(s.follow_up, user("follow"))
    plan = s.continue_plan()
    assert plan.queue == "followUp" and not plan.skip_initial_steering


def test_configure_changes_the_queue_modes_from_the_next_poll() -> None:
    """SPEC 8: ``steeringMode`` and ``followUpMode`` apply from the next poll."""
    s = session()
    s.configure(AgentSettings(steering_mode="all", follow_up_mode="all"), {"steering_mode", "follow_up_mode"})
    for queue in (s.steering, s.follow_up):
        queue.push(user("a"))
        queue.push(user("b"))
        assert [m.content for m in queue.poll()] == ["a", "b"]


def continued(s: Session) -> Session:
    """The session the next run of a continue-as-new builds from ``s``'s carry."""
    carry = SessionCarry.model_validate_json(s.carry(None, closed_publishers=[]).model_dump_json())
    return Session(s.settings, list(s.messages), carry, lambda: 1)


def test_clearing_the_queues_while_idle_cancels_the_run_their_messages_would_start() -> None:
    """A steer arriving while idle starts a run as continue() would; cleared
    before it began, no run is left to start on an emptied queue."""
    s = session()
    s.enqueue(s.steering, user("steer"))
    assert s.pending is not None
    assert [m.content for m in s.clear_queues("all")] == ["steer"]
    assert s.pending is None


def test_clearing_one_queue_while_idle_keeps_the_run_the_other_queue_starts() -> None:
    """Clearing the steering queue must not drop the run a queued follow-up
    started: the follow-up would stay queued with no run to deliver it."""
    s = session()
    s.enqueue(s.steering, user("steer"))
    s.enqueue(s.follow_up, user("follow"))
    s.clear_queues("steering")
    assert s.pending is not None and len(s.follow_up) == 1
    assert [m.content for m in s.continue_plan().prompts] == ["follow"]


def test_a_follow_up_left_queued_after_a_run_keeps_close_when_idle_from_completing() -> None:
    """README: closeWhenIdle completes when a run ends and BOTH queues are
    empty (after an abort queued messages stay queued)."""
    s = session(close_when_idle=True)
    s.follow_up.push(user("later"), 1)
    assert not s.is_busy() and not s.is_idle_and_drained()
    s.follow_up.clear()
    s.steering.push(user("now"), 2)
    assert not s.is_idle_and_drained()


def test_a_one_at_a_time_queue_hands_out_the_oldest_and_clear_returns_the_rest() -> None:
    queue = MessageQueue("one-at-a-time")
    for arrival, text in enumerate(["a", "b", "c"], start=1):
        queue.push(user(text), arrival)
    assert [m.content for m in queue.poll()] == ["a"]
    assert [(n, m.content) for n, m in queue.clear()] == [(2, "b"), (3, "c")]


def test_an_all_queue_drained_then_refilled_clears_only_the_new_messages() -> None:
    queue = MessageQueue("all")
    queue.push(user("a"), 1)
    queue.push(user("b"), 2)
    assert [m.content for m in queue.poll()] == ["a", "b"]
    queue.push(user("c"), 3)
    assert [(n, m.content) for n, m in queue.clear()] == [(3, "c")]


def test_continue_after_a_tool_result_is_accepted_with_nothing_queued() -> None:
    """SPEC 3: only an assistant message last needs a queued message."""
    s = Session(
        SessionSettings(),
        [user("hi"), calls(("c1", "echo", {})), ToolResultMessage(tool_call_id="c1", tool_name="echo")],
        SessionCarry(),
        lambda: 1,
    )
    s.check_continue()  # not refused
    assert s.continue_plan().prompts == []


def test_reset_clears_queues_usage_error_counters_and_the_last_run() -> None:
    """pi's reset(): transcript, queues, usage, error and counters cleared."""
    s = session()
    s.begin_run()
    s.messages.append(
        AssistantMessage(
            stop_reason="aborted",
            error_message="Aborted",
            usage=Usage(total_tokens=7, cost=Cost(total=0.5)),
        )
    )
    s.observe(MessageEndEvent(message=s.messages[-1]))
    s.observe(TurnEndEvent(message=s.messages[-1], tool_results=[]))
    s.observe(AgentEndEvent(messages=[]))
    s.steering.push(user("steer"), 1)
    s.follow_up.push(user("follow"), 2)
    s.reset()
    state = s.state(0, None)
    assert (state.message_count, state.steering_queue, state.follow_up_queue) == (0, 0, 0)
    assert (state.turns, state.runs, state.error_message) == (0, 0, None)
    assert state.usage.total_tokens == 0 and state.usage.cost.total == 0
    assert s.idle_result().model_dump() == {"runs": 0, "stopReason": None, "messages": []}


def test_wait_for_idle_before_any_run_returns_no_messages_of_a_given_transcript() -> None:
    """A conversation started with a prior transcript and no prompt: no run
    yet, so no run's messages (not the given transcript)."""
    s = session()
    result = s.idle_result()
    assert result.runs == 0 and result.messages == []


def test_the_tools_a_run_had_started_are_not_pending_once_it_ends() -> None:
    s = session()
    s.begin_run()
    s.observe(ToolExecutionStartEvent(tool_call_id="c1", tool_name="slow", args={}))
    assert s.state(0, None).pending_tool_calls == ["c1"]
    s.observe(AgentEndEvent(messages=[]))
    assert s.state(0, None).pending_tool_calls == []


def test_wait_for_idle_reports_how_the_last_message_of_the_run_ended() -> None:
    s = session()
    s.begin_run()
    s.messages += [
        calls(("c1", "echo", {})),
        ToolResultMessage(tool_call_id="c1", tool_name="echo"),
        say("done"),
    ]
    s.observe(AgentEndEvent(messages=[]))
    assert s.idle_result().stop_reason == "stop"


def test_a_failure_turn_is_not_counted_as_a_model_turn() -> None:
    s = session()
    s.begin_run()
    s.observe(TurnEndEvent(message=say("a"), tool_results=[]))
    s.observe(TurnEndEvent(message=say("failed"), tool_results=[], model_turn=False))
    assert s.state(0, None).turns == 1


def test_an_aborted_run_sets_the_error_message() -> None:
    """SPEC 8: errorMessage is set for error AND aborted ends."""
    s = session()
    s.begin_run()
    s.observe(
        MessageEndEvent(message=AssistantMessage(stop_reason="aborted", error_message="Request aborted"))
    )
    assert s.state(0, None).error_message == "Request aborted"


def test_limits_stop_a_run_once_reached_exactly() -> None:
    """maxTurns, maxTotalTokens and maxCost: reached (not only passed) stops the run."""
    s = session(max_turns=2)
    run = s.begin_run()
    run.turns = 1
    assert not s.should_stop_after_turn()
    run.turns = 2
    assert s.should_stop_after_turn()
    s = session(max_total_tokens=100)
    s.begin_run()
    s.usage = Usage(total_tokens=100)
    assert s.should_stop_after_turn()
    s = session(max_cost=0.5)
    s.begin_run()
    s.usage = Usage(cost=Cost(total=0.5))
    assert s.should_stop_after_turn()


def test_abort_and_stop_after_turn_before_a_run_begins_are_kept_for_it() -> None:
    """README: abort and stop_after_turn also act on a run accepted but not begun yet."""
    s = session()
    s.enqueue(s.follow_up, user("go"))
    assert s.pending is not None
    assert s.request_abort() is False  # nothing to cancel yet
    s.request_stop_after_turn()
    assert s.pending.abort_requested and s.pending.stop_requested


def test_a_continue_as_new_hands_over_both_queues_in_arrival_order() -> None:
    """The arrival order across both queues (what clear_queues returns) survives the switch."""
    s = session()
    s.begin_run()
    s.enqueue(s.follow_up, user("follow one"))
    s.enqueue(s.steering, user("steer one"))
    s.enqueue(s.follow_up, user("follow two"))
    after = continued(s)
    assert (len(after.steering), len(after.follow_up)) == (1, 2)
    assert [m.content for m in after.clear_queues("all")] == ["follow one", "steer one", "follow two"]


def test_a_continue_as_new_hands_over_the_error_the_last_run_and_the_pending_run() -> None:
    s = session()
    s.begin_run()
    s.messages.append(AssistantMessage(stop_reason="error", error_message="model down"))
    s.observe(MessageEndEvent(message=s.messages[-1]))
    s.observe(AgentEndEvent(messages=[]))
    s.enqueue(s.follow_up, user("again"))
    s.request_abort()
    after = continued(s)
    assert after.state(0, None).error_message == "model down"
    assert after.idle_result().model_dump() == s.idle_result().model_dump()
    assert after.idle_result().stop_reason == "error" and len(after.idle_result().messages) == 1
    assert after.pending is not None and after.pending.from_continue and after.pending.abort_requested


def test_an_abort_requested_during_a_run_survives_a_continue_as_new() -> None:
    s = session()
    s.begin_run()
    assert s.request_abort() is True
    assert continued(s).abort_requested


def test_configure_changes_only_the_settings_it_names() -> None:
    """SPEC 8: a partial settings object; `{}` changes nothing and returns the settings in force."""
    s = session(system_prompt="Be brief.", max_turns=3, steering_mode="all")
    before = s.settings_in_force().model_dump()
    assert s.configure(AgentSettings(), set()).model_dump() == before
    after = s.configure(AgentSettings(model="other-model"), {"model"})
    assert after.model == "other-model"
    assert (after.system_prompt, after.max_turns, after.steering_mode) == ("Be brief.", 3, "all")
    assert s.steering.mode == "all"


def test_a_message_queued_during_a_run_starts_no_run_of_its_own() -> None:
    """SPEC 6: only a steer or follow-up that ARRIVES while idle starts a
    run; one sent during a run waits for that run's polls (else a stray run
    followed every run that was steered)."""
    s = session()
    s.begin_run()
    s.enqueue(s.steering, user("steer"))
    s.enqueue(s.follow_up, user("follow"))
    assert s.pending is None
    s.observe(AgentEndEvent(messages=[]))
    assert s.pending is None and len(s.steering) == 1 and len(s.follow_up) == 1
    s.enqueue(s.follow_up, user("while idle"))
    assert s.pending is not None and s.pending.from_continue
