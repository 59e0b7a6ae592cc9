"""Conversations wedged by the SDK core's update fault, found and reset.

The fault (temporalio 1.35; sdk-rust #888, closed there unreproduced):
a workflow task accepted an update (a subscriber's read) and recorded a
local activity's marker, and the task after it never completed (its
worker was killed). The next worker replays that task's activation,
where the update's handler now returns: the core keeps the
``ProtocolMessageCommand`` of the answer but drops its message, as one
made while replaying, and the server refuses every workflow task of the
conversation from then on ("BadUpdateWorkflowExecutionMessage:
ProtocolMessageCommand referenced absent message ID .../complete").
``tests/test_repair.py`` makes it happen on purpose.

Nothing in the workflow can avoid it (the answer is the core's to send),
but a reset heals it: the run is reset to its last completed workflow
task, so that task's activation runs live again and the answer goes out
with its message. The server applies the signals and updates the
conversation received after that point again, so no message is lost; what
the task had started (a tool call) may run again, as after any crash.

The worker looks for such conversations on its task queue every 30 s
(``AGENT_REPAIR_WEDGED``, ``AGENT_REPAIR_INTERVAL_SECONDS``). The server marks them in
the ``TemporalReportedProblems`` search attribute after a few failed
attempts (5 by default, about 25 s; 2 on the embedded dev server); each one is checked from its
history before it is reset, and claimed first (a workflow started before
the reset and ended after it), so that two workers never reset it twice.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from datetime import timedelta

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    GetWorkflowExecutionHistoryReverseRequest,
    ResetWorkflowExecutionRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from runtime.connect import visibility_quoted

PROBLEM = "cause=WorkflowTaskFailedCauseBadUpdateWorkflowExecutionMessage"
"""How the server names the fault in ``TemporalReportedProblems``."""

_WEDGE_CAUSE = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_BAD_UPDATE_WORKFLOW_EXECUTION_MESSAGE
_RESET_CAUSE = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW
_CLAIM_TYPE = "AgentRepairClaim"

log = logging.getLogger(__name__)
_wedged_again: set[str] = set()  # runs said to be left alone, by run id


def _said_once(run_id: str, workflow_id: str) -> None:
    if run_id not in _wedged_again:
        _wedged_again.add(run_id)
        log.error(
            "Conversation %s was wedged again by the update fault right after a reset, before any workflow "
            "task completed: it is left for an operator (its history and the worker's log say why).",
            workflow_id,
        )


def claim_id(run_id: str) -> str:
    """The workflow id whose start claims the repair of ``run_id``."""
    return f"agent-repair-{run_id}"


def claim_queue(task_queue: str) -> str:
    """Where claims are started: a queue no worker polls (a claim never runs)."""
    return f"{task_queue}.repair-claims"


async def reset_point(client: Client, workflow_id: str, run_id: str) -> int | None:
    """The id of the run's last ``WorkflowTaskCompleted`` event when every
    workflow task since it failed with the fault, else None: also when the
    run was reset and wedged again before a task completed (a reset would
    not help; it would run that step's tools again and again)."""
    token = b""
    failed = False  # the newest failure decides; older ones do not matter
    while True:
        page = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                maximum_page_size=200,
                next_page_token=token,
            ),
            timeout=timedelta(seconds=30),
        )
        for event in page.history.events:  # newest first
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                cause = event.workflow_task_failed_event_attributes.cause
                if not failed and cause != _WEDGE_CAUSE:
                    return None  # failing for another reason
                if failed and cause == _RESET_CAUSE:
                    _said_once(run_id, workflow_id)
                    return None
                failed = True
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                return event.event_id if failed else None
        token = page.next_page_token
        if not token:
            return None


async def _current(client: Client, workflow_id: str, run_id: str) -> bool:
    description = await client.get_workflow_handle(workflow_id).describe()
    return description.run_id == run_id and description.status == WorkflowExecutionStatus.RUNNING


async def repair(client: Client, workflow_id: str, run_id: str, task_queue: str) -> str | None:
    """Reset one wedged run; the new run's id, or None when it is not
    wedged, not the conversation's current run, or another worker holds it.

    The claim is a workflow (``claim_id``) started before the reset and
    ended after it: while one worker holds it no other can start it, and a
    worker that starts it after finds the run reset already (not current)."""
    if not await _current(client, workflow_id, run_id):
        return None
    point = await reset_point(client, workflow_id, run_id)
    if point is None:
        return None
    try:
        claim = await client.start_workflow(
            _CLAIM_TYPE,
            id=claim_id(run_id),
            task_queue=claim_queue(task_queue),
            # Taken again only after it ended (terminated: a failed reset is tried again).
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            execution_timeout=timedelta(minutes=5),
            memo={"conversation": workflow_id, "run": run_id, "resetTo": point},
        )
    except WorkflowAlreadyStartedError:
        return None
    outcome = "released: not reset"
    try:
        if not await _current(client, workflow_id, run_id):
            return None  # another worker reset it meanwhile
        response = await client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                reason=(
                    "wedged by the SDK core's update fault (sdk-rust #888): every workflow task failed "
                    "with BadUpdateWorkflowExecutionMessage; reset by an agent worker"
                ),
                workflow_task_finish_event_id=point,
                request_id=str(uuid.uuid4()),
            ),
            timeout=timedelta(seconds=30),
        )
        outcome = f"reset to event {point}: run {response.run_id}"
    finally:
        try:  # its record stays in the UI: which run was reset, to what
            await claim.terminate(outcome)
        except Exception:  # it times out by itself
            pass
    log.warning(
        "Conversation %s was wedged by the SDK core's update fault (sdk-rust #888): reset it to its "
        "workflow task completed at event %d (run %s -> %s). The signals and updates it received "
        "after that are applied again; a tool call that task started may run again.",
        workflow_id,
        point,
        run_id,
        response.run_id,
    )
    return response.run_id


async def repair_wedged(client: Client, task_queue: str, workflow_type: str = "AgentWorkflow") -> list[str]:
    """Look once: reset each wedged conversation of ``workflow_type`` on
    ``task_queue``; the ids of those reset."""
    query = (
        f"WorkflowType = {visibility_quoted(workflow_type)} AND TaskQueue = {visibility_quoted(task_queue)} "
        f"AND ExecutionStatus = 'Running' AND TemporalReportedProblems = {visibility_quoted(PROBLEM)}"
    )
    repaired = []
    async for execution in client.list_workflows(query):
        try:
            if await repair(client, execution.id, execution.run_id, task_queue):
                repaired.append(execution.id)
        except Exception as err:  # the next look tries again
            log.warning("Could not repair conversation %s: %s", execution.id, err)
    return repaired


async def marks_problems(client: Client) -> bool | None:
    """Whether the server marks workflows whose tasks keep failing in
    ``TemporalReportedProblems`` (None: it does not say)."""
    try:
        response = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace), timeout=timedelta(seconds=10)
        )
    except Exception:
        return None
    return response.namespace_info.capabilities.reported_problems_search_attribute


async def repair_loop(client: Client, task_queue: str, stop: asyncio.Event, interval: float) -> None:
    """``repair_wedged`` every ``interval`` seconds until ``stop`` is set
    (with up to a third more at random: workers on a queue look apart);
    only a warning when the server does not mark wedged conversations."""
    if await marks_problems(client) is False:
        log.warning(
            "The Temporal server does not mark workflows whose tasks keep failing "
            "(TemporalReportedProblems: server 1.30 or later, and, self-hosted, "
            "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute=5): conversations the SDK "
            "core's update fault wedges are not repaired (README, What can go wrong)."
        )
        return
    said = False
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval * (1 + random.random() / 3))
            return
        except TimeoutError:
            pass
        try:
            await repair_wedged(client, task_queue)
            said = False
        except Exception as err:  # e.g. a server without TemporalReportedProblems
            if not said:
                log.warning("Could not look for wedged conversations (tries again): %s", err)
                said = True
