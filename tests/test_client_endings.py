"""How ``client.Conversation`` says a conversation ended, or went on,
while a script waited on it (found by a review of the client)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest

from client import Conversation, ConversationEnded
from tests.support.stack import Stack
from tests.support.tools import guarded_call


async def _waiting_for_approval(conversation: Conversation) -> None:
    for _ in range(400):
        if (await conversation.state()).pending_approvals:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no call waits for approval")


async def test_wait_for_idle_on_a_conversation_terminated_meanwhile_says_how_it_ended(stack: Stack) -> None:
    """It raised a bare ``Refused`` quoting the SDK ("Workflow Update failed
    because the Workflow completed ..."), which ``except ConversationNotFound``
    missed; ``prompt(wait=True)`` already said it as ``ConversationEnded``."""
    stack.script({"tool_calls": [guarded_call("call_a", "x")]}, {"text": "done"})
    conversation = await stack.conversation()
    await conversation.prompt("go", wait=False)
    await _waiting_for_approval(conversation)
    waiter = asyncio.create_task(conversation.wait_for_idle())
    await asyncio.sleep(0.5)
    await conversation.handle.terminate("operator")
    with pytest.raises(ConversationEnded, match=r"was terminated before it was idle"):
        await asyncio.wait_for(waiter, 30)


@pytest.mark.expect_task_failures  # a reset records the task it resets from as failed (ResetWorkflow)
async def test_result_follows_a_reset_to_the_run_that_goes_on(stack: Stack) -> None:
    """A reset (the worker's repair of a wedged conversation, or an
    operator's) ends the run ``result()`` waited on as terminated while the
    conversation goes on in the reset run: ``result()`` raised
    ``TerminatedError`` where ``wait_for_idle`` went on."""
    stack.script({"tool_calls": [guarded_call("call_a", "x")]}, {"text": "done"})
    conversation = await stack.conversation(close_when_idle=True)
    result = asyncio.create_task(conversation.result())
    await conversation.prompt("go", wait=False)
    await _waiting_for_approval(conversation)
    history = await conversation.handle.fetch_history()
    point = [e.event_id for e in history.events if e.HasField("workflow_task_completed_event_attributes")][-1]
    run_id = (await conversation.handle.describe()).run_id
    await stack.client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=stack.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=conversation.id, run_id=run_id),
            reason="a client review",
            workflow_task_finish_event_id=point,
            request_id=str(uuid.uuid4()),
        )
    )
    await _waiting_for_approval(conversation)
    await conversation.approve("call_a")
    transcript = await asyncio.wait_for(result, 30)
    assert transcript.messages[-1].text == "done"


async def test_how_a_conversation_that_never_was_ended_is_that_it_does_not_exist(stack: Stack) -> None:
    """A mistyped id read "The conversation has ended."."""
    conversation = Conversation.attach(stack.client, f"no-such-{uuid.uuid4().hex[:8]}")
    assert await conversation.how_it_ended() == (
        "The conversation does not exist (no conversation has this id)."
    )
