"""The ``execute_tool`` activity: runs one tool call.

Arguments arrive validated by the workflow against the tool's recorded
schema; the tool's own model parses them again here. A tool's exception
becomes an error result (the model sees the message); a dead worker makes
the activity time out on its heartbeat and Temporal runs the call again,
with the same idempotency key. A result is made safe to send (text capped
for the model, details and images bounded, nesting checked) before the
activity reports the call done, so a result that cannot be sent never
makes Temporal run the tool's side effect again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.blobs import private_dirs
from activities.events import ActivityEventPublisher, attempt_budget
from activities.heartbeat import heartbeating, retry_reason
from activities.redact import TOOL_SECRETS, scrub, scrub_json, scrub_known
from activities.tools import (
    ToolArgumentsError,
    ToolContext,
    ToolResult,
    ToolSpec,
    _current,
    parse_arguments,
    registered_tools,
)
from workflows.arguments import MAX_NESTING, clean_json, clean_text, nesting_depth
from workflows.contract import ToolRequest
from workflows.hooks import failure_text, is_user_failure
from workflows.models import (
    ImageContent,
    TextContent,
    ToolExecutionRetryEvent,
    ToolExecutionUpdateEvent,
    ToolOutcome,
    UserContent,
    text_result,
)

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_CAP = 50_000
# A result's details (for clients, not the model) and images above this
# many bytes of JSON are replaced by a note: the workflow keeps every
# result in its transcript, its history and every continue-as-new.
MAX_RESULT_BYTES = 1_000_000


class ToolActivities:
    """Runs tool calls; register ``ToolActivities(...).execute_tool``.

    ``output_cap`` characters of a result's text go to the model; the full
    text is written under ``output_dir`` (mode 0600) and its path put in
    ``details``. Without ``output_dir`` it is not kept: a default here
    would write it under the process's directory, a tool's workspace. The
    text of an error result is scrubbed of credentials (``secrets``
    verbatim, and common shapes): an exception's message may quote one,
    and it is stored in the history and shown to the model.
    """

    def __init__(
        self,
        tools: Mapping[str, ToolSpec] | None = None,
        *,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        output_dir: Path | None = None,
        secrets: Sequence[str | None] = (),
    ) -> None:
        self._tools = tools
        self._secrets = tuple(secrets)
        self._tool_secrets = tuple(s for s in self._secrets if s)  # what a running tool may scrub
        self._output_cap = output_cap
        self._output_dir = output_dir.resolve() if output_dir is not None else None

    @activity.defn(name="execute_tool")
    async def execute_tool(self, request: ToolRequest) -> ToolOutcome:
        call = request.tool_call
        tools = self._tools if self._tools is not None else registered_tools()
        spec = tools.get(call.name)
        if spec is None:
            return _error(
                f"Tool {call.name} is not available on this worker: it was removed or renamed "
                "after this conversation started, or this worker does not load the tool module "
                "the others on its task queue do."
            )
        info = activity.info()
        key = request.idempotency_key or f"{info.workflow_id}/{info.activity_id}"
        try:
            args = parse_arguments(spec, call.arguments)
        except ToolArgumentsError as err:
            return self._capped_error(str(err), info.workflow_id or "", key)
        except BaseException as err:
            # A validator of the tool's own raising what pydantic does not
            # wrap (a RuntimeError, SystemExit): it failed the activity,
            # which was tried three times for it (a robustness audit).
            if not is_user_failure(err):
                raise
            said = f'Validation failed for tool "{call.name}": {failure_text(err)}'
            return self._capped_error(said, info.workflow_id or "", key)
        # A local tool (the fast path) sends no signal: the workflow takes
        # one only after the workflow task running the tool ends, so its
        # progress reached subscribers after its result, stale (a crash
        # test). Its events go with its result, its progress as the latest.
        budget = 0 if info.is_local else attempt_budget(request.max_batches, info.attempt)
        async with ActivityEventPublisher(request.stream_batch_ms, budget) as events:
            if info.attempt > 1:
                # The attempt before did not report (its worker stopped, it
                # stopped heartbeating): say so before the tool starts over,
                # as a model call's ``message_retry`` does, so a subscriber
                # knows its progress restarts and its side effects may repeat.
                events.publish(
                    ToolExecutionRetryEvent(
                        tool_call_id=call.id,
                        tool_name=call.name,
                        attempt=info.attempt,
                        reason=retry_reason(info),
                    ),
                    flush=True,
                )
            async with heartbeating():
                reported = False
                shown_args = call.arguments if request.raw_arguments is None else request.raw_arguments

                def publish_progress(partial: Any) -> None:
                    # The first report goes out at once, the rest in batches
                    # (``stream_batch_ms``): a tool reporting every few
                    # milliseconds sent a signal, and cost a workflow task,
                    # each time (a Temporal review).
                    nonlocal reported
                    events.publish(
                        ToolExecutionUpdateEvent(
                            tool_call_id=call.id,
                            tool_name=call.name,
                            args=shown_args,
                            # Cleaned: a lone surrogate failed the batch's signal,
                            # then the activity, after the tool had run.
                            partial_result=clean_json(scrub_json(_as_result_json(partial), self._secrets)),
                        ),
                        flush=not reported,
                    )
                    reported = True

                token = _current.set(
                    ToolContext(
                        tool_call_id=call.id,
                        tool_name=call.name,
                        arguments=call.arguments,
                        workflow_id=info.workflow_id or "",
                        activity_id=info.activity_id,
                        attempt=info.attempt,
                        idempotency_key=key,
                        publish_progress=publish_progress,
                    )
                )
                secrets = TOOL_SECRETS.set(self._tool_secrets)
                started = time.monotonic()
                try:
                    outcome = self._bounded(
                        _as_outcome(await spec.function(args)), info.workflow_id or "", key
                    )
                except BaseException as err:  # the model sees the failure as an error result
                    if not is_user_failure(err):  # the activity's cancellation, among others
                        raise
                    # SystemExit and the like too: going up, they stopped the worker process.
                    outcome = self._capped_error(failure_text(err), info.workflow_id or "", key)
                finally:
                    TOOL_SECRETS.reset(secrets)
                    _current.reset(token)
        _record_tool_metrics(call.name, time.monotonic() - started, outcome.is_error)
        outcome = self._scrubbed(outcome)
        return outcome.model_copy(update={"events": events.tail})

    def _scrubbed(self, outcome: ToolOutcome) -> ToolOutcome:
        """The result with the worker's own secrets taken out of its text
        (a tool may read or print them), and of an error's text whatever
        looks like a credential too."""
        clean = (lambda text: scrub(text, self._secrets)) if outcome.is_error else self._without_secrets
        content = [
            c.model_copy(update={"text": clean(c.text)}) if isinstance(c, TextContent) else c
            for c in outcome.content
        ]
        details = scrub_json(outcome.details, self._secrets)
        return outcome.model_copy(update={"content": content, "details": details})

    def _without_secrets(self, text: str) -> str:
        return scrub_known(text, self._secrets)

    def _bounded(self, outcome: ToolOutcome, workflow_id: str, key: str) -> ToolOutcome:
        """The outcome, safe to send and to keep in the transcript."""
        outcome = self.cap_output(outcome, workflow_id, key)
        notes: dict[str, Any] = {}
        details = outcome.details
        problem = _details_problem(details)
        if problem:
            notes["details"] = f"The tool's details were dropped: {problem}."
            details = {}
        content = list(outcome.content)
        images = [c for c in content if isinstance(c, ImageContent)]
        if sum(len(i.data) for i in images) > MAX_RESULT_BYTES:
            content = [c for c in content if not isinstance(c, ImageContent)]
            content.append(
                TextContent(text=f"[{len(images)} image(s) dropped: more than {MAX_RESULT_BYTES:,} bytes.]")
            )
        if notes:
            details = {**(details if isinstance(details, dict) else {"details": details}), "notes": notes}
        bounded = outcome.model_copy(update={"content": content, "details": details})
        try:
            bounded.model_dump_json()
        except (ValueError, TypeError) as err:
            # Text with a lone surrogate (a file name read with
            # surrogateescape) goes on with U+FFFD, as a failure's text
            # does: refused whole, a tool that had acted (deleted the file)
            # looked to the model as if it had failed (a robustness audit).
            cleaned = bounded.model_copy(
                update={
                    "content": [
                        c.model_copy(update={"text": clean_text(c.text)}) if isinstance(c, TextContent) else c
                        for c in bounded.content
                    ],
                    "details": clean_json(bounded.details),
                }
            )
            try:
                cleaned.model_dump_json()
            except (ValueError, TypeError):
                return _error(f"The tool's result could not be encoded as JSON: {err}")
            return cleaned
        return bounded

    def _capped_error(self, text: str, workflow_id: str, key: str) -> ToolOutcome:
        """An error result, its text capped as a result's is: a tool raising
        with a 10 MB message sent it whole to the model (a robustness audit)."""
        return self.cap_output(_error(text), workflow_id, key)

    def cap_output(self, outcome: ToolOutcome, workflow_id: str, key: str) -> ToolOutcome:
        """Keep at most ``output_cap`` characters of text for the model, with
        a note saying so; the full output goes to a file named in ``details``
        (one per conversation and call, named by the call's idempotency key,
        which is unique in the conversation even when a model reuses call
        ids: see ``output_path``)."""
        cap = self._output_cap
        full = "".join(c.text for c in outcome.content if isinstance(c, TextContent))
        if len(full) <= cap:
            return outcome  # scrubbed with the rest of the result (``_scrubbed``)
        full = scrub_known(full, self._secrets)  # the file is written before that
        kept_in: str | None = None
        if self._output_dir is not None:
            path = output_path(self._output_dir, workflow_id, key)
            try:
                self._write_full_output(path, full)
                kept_in = str(path)
            except OSError as err:  # a read-only AGENT_TOOL_OUTPUT_DIR: the cut output still goes on
                logger.warning("Could not keep a tool's full output in %s: %s", path, err.strerror or err)
        kept: list[UserContent] = [c for c in outcome.content if not isinstance(c, TextContent)]
        kept.insert(
            0,
            TextContent(
                text=full[:cap] + f"\n[Output truncated: {len(full)} characters, the first {cap} are "
                "shown. Ask for a smaller part (a line range, a filter) to see the rest.]"
            ),
        )
        details = outcome.details if isinstance(outcome.details, dict) else {"details": outcome.details}
        if kept_in is None:
            return outcome.model_copy(update={"content": kept})
        return outcome.model_copy(update={"content": kept, "details": {**details, "fullOutputPath": kept_in}})

    @staticmethod
    def _write_full_output(path: Path, text: str) -> None:
        private_dirs(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as file:
            file.write(text)


def output_path(output_dir: Path, workflow_id: str, key: str) -> Path:
    """Where a call's full output is written: a directory per conversation
    and a file per call (its idempotency key), each named by the id made
    safe for a file name (cut) and a digest of the id itself. Ids that read
    the same once made safe (``team/alice`` and ``team_alice``), long ones
    that share a start, or a call id made up to look like another
    conversation's path never share a file."""

    def name(text: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]
        return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', text)[:80]}-{digest}"

    return output_dir / name(workflow_id) / f"tool-{name(key)}.txt"


def _record_tool_metrics(tool: str, seconds: float, is_error: bool) -> None:
    meter = activity.metric_meter().with_additional_attributes({"tool": tool})
    meter.create_histogram_timedelta("agent_tool_latency", "Tool call duration").record(
        timedelta(seconds=seconds)
    )
    if is_error:
        meter.create_counter("agent_tool_errors", "Tool calls that ended in an error result").add(1)


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
    # SPEC §5: an error result is {content: [text], details: {}}.
    return ToolOutcome(content=text_result(text), is_error=True, details={})


def _details_problem(details: Any) -> str | None:
    """Why a result's details cannot be kept (too deep, no JSON, too
    large: what the payload holds, as UTF-8 JSON), or None. A dict with a
    tuple for a key was dropped as "more than 1,000,000 bytes" (an audit)."""
    if nesting_depth(details) > MAX_NESTING:
        return f"nested deeper than {MAX_NESTING} levels"
    try:
        text = json.dumps(details, ensure_ascii=False, separators=(",", ":"), default=str)
    except RecursionError:
        return f"nested deeper than {MAX_NESTING} levels"
    except (ValueError, TypeError) as err:
        return f"they are not JSON ({clean_text(str(err))})"
    if len(text.encode("utf-8", "replace")) > MAX_RESULT_BYTES:
        return f"more than {MAX_RESULT_BYTES:,} bytes of JSON"
    return None
