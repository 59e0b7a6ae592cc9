"""The session's queues and ``continue`` plan, without a server (SPEC 3,
6 and 8): behaviours a mutation audit found only the conformance tests
touched, or none."""

from __future__ import annotations

from typing import Any

from tests.support.fake_loop import say, user
from workflows.contract import AgentSettings, SessionCarry, SessionSettings
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
