"""Finding conversations: each keeps AgentStatus, AgentModel, AgentTurns,
AgentTotalTokens and AgentCost up to date, so a visibility query (the UI's
search box, `starter.py list`) finds, say, every conversation waiting for
an approval."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio.client import Client

from tests.support.stack import EventLog, Stack


async def find(
    client: Client, query: str, among: set[str], expected: set[str], timeout: float = 15
) -> set[str]:
    """The ids among ``among`` that ``query`` lists, once they are
    ``expected`` (visibility is eventually consistent) or at the timeout."""
    found: set[str] = set()
    for _ in range(int(timeout / 0.2)):
        found = {w.id async for w in client.list_workflows(query)} & among
        if found == expected:
            break
        await asyncio.sleep(0.2)
    return found


async def attributes(client: Client, workflow_id: str) -> dict[str, Any]:
    description = await client.get_workflow_handle(workflow_id).describe()
    return {key.name: value for key, value in description.typed_search_attributes}


async def test_conversations_are_found_by_status_and_model(stack: Stack) -> None:
    idle = await stack.start()
    stack.script({"text": "four", "usage": {"prompt_tokens": 10, "completion_tokens": 3}})
    answered = await stack.start(prompt="2+2?")
    await answered.execute_update("wait_for_idle")

    stack.script({"tool_calls": [{"id": "s1", "name": "slow", "arguments": {"seconds": 300, "steps": 300}}]})
    running = await stack.start(prompt="work")
    log = EventLog(stack.client, running.id)
    await log.wait_for_type("tool_execution_start")
    log.close()

    stack.script({"tool_calls": [{"id": "g1", "name": "guarded_echo", "arguments": {"text": "x"}}]})
    waiting = await stack.start(prompt="ask")
    log = EventLog(stack.client, waiting.id)
    await log.wait_for_type("tool_approval_request")
    log.close()

    closed = await stack.start()
    await closed.signal("close")
    await closed.result()
    stack.script({"text": "done"})
    done = await stack.start(prompt="once", closeWhenIdle=True)  # as `starter.py run`
    await done.result()
    assert (await done.query("state", result_type=dict))["status"] == "closed"

    ids = {h.id for h in (idle, answered, running, waiting, closed, done)}
    by_status = {
        "idle": {idle.id, answered.id},
        "running": {running.id},
        "awaiting-approval": {waiting.id},
        "closed": {closed.id, done.id},
    }
    for status, expected in by_status.items():
        assert await find(stack.client, f"AgentStatus = '{status}'", ids, expected) == expected, status
    assert await find(stack.client, f"AgentModel = '{stack.model}'", ids, ids) == ids

    values = await attributes(stack.client, answered.id)
    assert values["AgentTurns"] == 1 and values["AgentTotalTokens"] == 13
    assert values["AgentModel"] == stack.model and values["AgentStatus"] == "idle"
    assert "AgentCost" in values

    await running.signal("abort")
    await waiting.signal("abort")
    for handle in (idle, answered, running, waiting):
        await handle.signal("close")


def agent_upserts(history: Any) -> list[dict[str, Any]]:
    """The Agent* search attributes each upsert of the history set (the SDK's
    own TemporalChangeVersion upsert left out)."""
    upserts = []
    for event in history.events:
        if event.HasField("upsert_workflow_search_attributes_event_attributes"):
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            values = {
                name: json.loads(payload.data) for name, payload in fields.items() if name.startswith("Agent")
            }
            if values:
                upserts.append(values)
    return upserts


async def test_a_fast_run_upserts_its_counters_once_at_the_end(stack: Stack) -> None:
    # Twelve turns in well under SEARCH_ATTRIBUTE_INTERVAL: the status
    # changes (running, then idle) carry the counters; no turn pays for an
    # upsert of its own.
    stack.script(
        *[{"tool_calls": [{"id": f"e{i}", "name": "echo", "arguments": {"text": "x"}}]} for i in range(11)]
    )
    stack.script({"text": "done"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    await handle.result()
    upserts = agent_upserts(await handle.fetch_history())
    # Completed by closeWhenIdle: `closed`, in the one upsert at its end.
    assert [u.get("AgentStatus") for u in upserts] == ["running", "closed"]
    assert upserts[-1]["AgentTurns"] == 12


async def test_a_slow_run_refreshes_its_counters_at_a_turn_boundary(stack: Stack) -> None:
    # A turn that takes longer than SEARCH_ATTRIBUTE_INTERVAL (10 s): at the
    # next turn boundary the counters are upserted while the run goes on.
    stack.script({"tool_calls": [{"id": "s", "name": "slow", "arguments": {"seconds": 10.5, "steps": 3}}]})
    stack.script({"tool_calls": [{"id": "e", "name": "echo", "arguments": {"text": "x"}}]})
    stack.script({"text": "done"})
    handle = await stack.start(prompt="go", closeWhenIdle=True)
    await handle.result()
    upserts = agent_upserts(await handle.fetch_history())
    assert [u.get("AgentStatus") for u in upserts] == ["running", None, "closed"]
    # The refresh carried the counters that had changed: the first answer's tokens.
    assert set(upserts[1]) <= {"AgentTurns", "AgentTotalTokens", "AgentCost"}
    assert upserts[1]["AgentTotalTokens"] > 0
    assert upserts[2]["AgentTurns"] == 3


async def test_usage_a_model_reports_past_any_count_does_not_wedge_the_conversation(stack: Stack) -> None:
    """A server reporting int64-sized token counts (or nonsense) must not
    make the search-attribute upsert fail every workflow task: the counts
    are bounded (2**53 - 1) and what is no count reads 0."""
    huge = 2**63 - 1
    stack.script({"text": "big", "usage": {"prompt_tokens": huge, "completion_tokens": huge}})
    handle = await stack.start(prompt="count")
    await asyncio.wait_for(handle.execute_update("wait_for_idle"), 30)
    values = await attributes(stack.client, handle.id)
    assert values["AgentTotalTokens"] == 2**53 - 1 and values["AgentStatus"] == "idle"
    stack.script({"text": "again"})
    await handle.execute_update("prompt", "and again")
    await asyncio.wait_for(handle.execute_update("wait_for_idle"), 30)
    history = await handle.fetch_history()
    assert not [e for e in history.events if e.HasField("workflow_task_failed_event_attributes")]
    await handle.signal("close")


async def test_a_model_name_past_what_a_keyword_holds_is_cut_not_fatal(stack: Stack) -> None:
    """The server refuses a Keyword over 2 KB and terminated the whole
    conversation: AgentModel keeps the name's first 150 characters."""
    long_name = "m" * 2100
    handle = await stack.start()
    settings = await handle.execute_update("configure", {"model": long_name})
    assert settings["model"] == long_name
    await handle.execute_update("configure", {"model": stack.model})  # a status change upserts the model
    await handle.execute_update("configure", {"model": "\U0001f600" * 2100})
    stack.script({"text": "hi"})
    await handle.execute_update("prompt", "hello")
    await asyncio.wait_for(handle.execute_update("wait_for_idle"), 30)
    values = await attributes(stack.client, handle.id)
    assert values["AgentModel"] == "\U0001f600" * 150
    assert (await handle.describe()).status.name == "RUNNING"
    await handle.signal("close")


async def run_histories(stack: Stack, handle: Any) -> list[Any]:
    """The histories of a conversation's runs, first to last (each
    continue-as-new names the next run)."""
    histories = []
    run_id = handle.first_execution_run_id or handle.run_id
    while run_id:
        history = await stack.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
    return histories


async def test_counters_refresh_in_a_long_run_that_continues_as_new_every_turn(stack: Stack) -> None:
    """Each run counted the interval again from its own start, so a run
    continued as new every few seconds never published its counters: a
    filter on AgentCost missed a long, costly run. The time of the last
    upsert now goes on across continue-as-new."""
    # Three turns of 3.6 s, each its own run: 10.8 s in all, no run 10 s long.
    for i in range(3):
        stack.script(
            {"tool_calls": [{"id": f"s{i}", "name": "slow", "arguments": {"seconds": 3.6, "steps": 2}}]}
        )
    stack.script({"text": "done"})
    handle = await stack.start(prompt="go", closeWhenIdle=True, continueAsNewAfterTurns=1)
    await asyncio.wait_for(handle.result(), 60)
    histories = await run_histories(stack, handle)
    assert len(histories) >= 4
    refreshed = [u for history in histories[1:] for u in agent_upserts(history) if "AgentStatus" not in u]
    assert refreshed and refreshed[0]["AgentTurns"] >= 1 and refreshed[0]["AgentTotalTokens"] > 0


async def test_a_close_during_a_run_leaves_the_counters_as_the_state_says(stack: Stack) -> None:
    """The upsert to `closed` went out as the close came; the turns that
    ended after it (the interrupted one, the aborted message's) never
    reached AgentTurns, which stayed short of `state.turns`."""
    stack.script({"tool_calls": [{"id": "s", "name": "slow", "arguments": {"seconds": 300, "steps": 300}}]})
    handle = await stack.start(prompt="work")
    log = EventLog(stack.client, handle.id)
    await log.wait_for_type("tool_execution_start")
    log.close()
    await handle.signal("close")
    await asyncio.wait_for(handle.result(), 30)
    state = await handle.query("state", result_type=dict)
    values = await attributes(stack.client, handle.id)
    assert values["AgentStatus"] == "closed"
    assert state["turns"] >= 2 and values["AgentTurns"] == state["turns"]


async def test_a_reset_clears_the_counters_at_once(stack: Stack) -> None:
    """After `reset` the state said 0 turns and no cost, while AgentTurns and
    AgentCost kept the old figures until a next run: `starter.py list` and a
    filter on AgentCost showed a cost the conversation no longer had."""
    stack.script({"text": "four", "usage": {"prompt_tokens": 10, "completion_tokens": 3}})
    handle = await stack.start(prompt="2+2?")
    await asyncio.wait_for(handle.execute_update("wait_for_idle"), 30)
    assert (await attributes(stack.client, handle.id))["AgentTurns"] == 1
    await handle.execute_update("reset")
    values = await attributes(stack.client, handle.id)
    assert values["AgentTurns"] == 0 and values["AgentTotalTokens"] == 0 and values["AgentCost"] == 0
    await handle.signal("close")
