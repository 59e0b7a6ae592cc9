"""The ``execute_tool`` activity: runs one tool call.

Arguments arrive already validated by the workflow. A tool's exception
becomes an error result (the model sees the message); a dead worker makes
the activity time out on its heartbeat and Temporal runs the call again,
with the same idempotency key.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.events import ActivityEventPublisher
from activities.heartbeat import heartbeating
from activities.tools import ToolContext, ToolResult, _current, registered_tools
from workflows.contract import ToolOutcome, ToolRequest
from workflows.models import TextContent, ToolExecutionUpdateEvent, UserContent, text_result


@activity.defn(name="execute_tool")
async def execute_tool(request: ToolRequest) -> ToolOutcome:
    call = request.tool_call
    spec = registered_tools().get(call.name)
    if spec is None:
        return _error(f"Tool {call.name} is not registered on this worker.")
    info = activity.info()
    args = spec.args_model.model_validate(call.arguments)
    async with ActivityEventPublisher(request.stream_batch_ms) as events, heartbeating():

        def publish_progress(partial: Any) -> None:
            events.publish(
                ToolExecutionUpdateEvent(
                    tool_call_id=call.id,
                    tool_name=call.name,
                    args=call.arguments,
                    partial_result=_as_result_json(partial),
                ),
                flush=True,
            )

        token = _current.set(
            ToolContext(
                tool_call_id=call.id,
                tool_name=call.name,
                arguments=call.arguments,
                workflow_id=info.workflow_id or "",
                activity_id=info.activity_id,
                attempt=info.attempt,
                idempotency_key=f"{info.workflow_id}/{info.activity_id}",
                publish_progress=publish_progress,
            )
        )
        try:
            outcome = cap_output(
                _as_outcome(await spec.function(args)), f"{info.workflow_id}/{info.activity_id}"
            )
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the model sees the failure as an error result
            outcome = _error(str(err) or type(err).__name__)
        finally:
            _current.reset(token)
    return outcome.model_copy(update={"events": events.tail})


def _as_outcome(returned: Any) -> ToolOutcome:
    if isinstance(returned, ToolResult):
        return ToolOutcome(
            content=_as_content(returned.content),
            details=returned.details,
            is_error=returned.is_error,
            terminate=returned.terminate,
        )
    if isinstance(returned, str):
        return ToolOutcome(content=text_result(returned))
    raise TypeError(f"A tool must return str or ToolResult, not {type(returned).__name__}.")


def _as_content(content: str | list[UserContent]) -> list[UserContent]:
    return text_result(content) if isinstance(content, str) else list(content)


def _as_result_json(partial: Any) -> Any:
    """A partial result in pi's ``{content, details}`` shape."""
    if isinstance(partial, ToolResult):
        return {"content": [c.model_dump() for c in _as_content(partial.content)], "details": partial.details}
    if isinstance(partial, str):
        return {"content": [{"type": "text", "text": partial}], "details": {}}
    return {"content": [], "details": partial}


def _error(text: str) -> ToolOutcome:
    return ToolOutcome(content=text_result(text), is_error=True)


def cap_output(outcome: ToolOutcome, key: str) -> ToolOutcome:
    """Keep at most ``AGENT_TOOL_OUTPUT_CAP`` characters of text (default
    50,000) for the model, with a note saying so. The full output is saved
    under ``AGENT_TOOL_OUTPUT_DIR`` and its path put in ``details``."""
    cap = int(os.environ.get("AGENT_TOOL_OUTPUT_CAP", "50000"))
    full = "".join(c.text for c in outcome.content if isinstance(c, TextContent))
    if len(full) <= cap:
        return outcome
    path = Path(os.environ.get("AGENT_TOOL_OUTPUT_DIR", ".agent-data/tool-output"))
    path = path.resolve() / (re.sub(r"[^A-Za-z0-9_.-]", "_", key) + ".txt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(full)
    kept: list[UserContent] = [c for c in outcome.content if not isinstance(c, TextContent)]
    kept.insert(
        0,
        TextContent(
            text=full[:cap] + f"\n[Output truncated: {len(full)} characters, the first {cap} are "
            "shown. Ask for a smaller part (a line range, a filter) to see the rest.]"
        ),
    )
    details = outcome.details if isinstance(outcome.details, dict) else {"details": outcome.details}
    return outcome.model_copy(update={"content": kept, "details": {**details, "fullOutputPath": str(path)}})
