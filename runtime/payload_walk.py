"""One walk of a workflow task's payload tree instead of three per direction.

temporalio 1.35 decodes each workflow activation in three passes over its
protobuf tree (external-storage reference decode, external-storage
retrieve, codec decode) and encodes each completion in three (codec
encode, external-storage store, reference encode). Each pass is a full
recursive walk by the SDK's generated ``PayloadVisitor`` (an ``await`` per
message and field), the storage pass makes an asyncio task per payload
sequence, and every pass copies every sequence back into its message even
when nothing changed: 94 of the 145 samples of the worker's workflow
activation handling in the benchmark's profile (bench/README.md, change
33), for payloads that, in a plain tool round, no pass changes.

Here the tree is walked once, with the SDK's own visitor, to collect each
payload and payload sequence in traversal order together with the command
it belongs to (the ``current_command_info`` that the SDK's
``CommandAwarePayloadVisitor`` sets, which picks each payload's
serialization context). Then the SDK's three data-converter steps run over
the collected targets in the SDK's order, each step over every target
before the next step, under the same command; the storage step only for
targets it can act on (a reference to retrieve, or to refuse when the
worker has no storage; a payload at or past the storage threshold to
store), with the same concurrency limit. A sequence is written back only
when a step returned other payloads. A system Nexus envelope (whose nested
payloads the SDK re-serializes during the walk) sends the whole task
through the SDK's own passes.

Like ``runtime/sandbox.py``, this reads private names of the SDK, so it
applies to the version it was read against only (else the stock passes,
and a warning); AGENT_PAYLOAD_WALK=off, or AGENT_SDK_FALLBACKS=on (which
CI runs), keeps the stock passes. tests/test_payload_walk.py checks that
both give the same bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import version
from typing import Any

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import ContinueAsNewInitiator

from runtime.converter import READING_CARRY, REFUSED, PayloadUnreadable, refused_reason

SUPPORTED_SDK = "1.35.0"

log = logging.getLogger(__name__)

Step = Callable[[Sequence[Payload]], Awaitable[list[Payload]]]


def _sdk() -> Any:
    """The SDK's private pieces this uses, or None when this is not the
    version it was read against (or the names moved)."""
    if version("temporalio") != SUPPORTED_SDK:
        return None
    try:
        import temporalio.bridge.worker as bridge_worker
        import temporalio.converter._data_converter as data_converter_module
        import temporalio.converter._extstore as extstore
        from temporalio.bridge._visitor_functions import VisitorFunctions
        from temporalio.worker._command_aware_visitor import CommandAwarePayloadVisitor, current_command_info
    except ImportError:
        return None
    needed = (
        (bridge_worker, "decode_activation"),
        (bridge_worker, "encode_completion"),
        (data_converter_module, "_is_reference_payload"),
        (data_converter_module, "_has_reference_marker"),
        (extstore, "StorageOperationMetrics"),
        (extstore, "_ENCODE_STORAGE_REFERENCES"),
    )
    if not all(hasattr(module, name) for module, name in needed):
        return None
    return {
        "bridge_worker": bridge_worker,
        "is_reference": data_converter_module._is_reference_payload,
        "has_marker": data_converter_module._has_reference_marker,
        "extstore": extstore,
        "VisitorFunctions": VisitorFunctions,
        "Visitor": CommandAwarePayloadVisitor,
        "command": current_command_info,
    }


_SDK = _sdk()
_STOCK: dict[str, Any] = (
    {}
    if _SDK is None
    else {
        "decode_activation": _SDK["bridge_worker"].decode_activation,
        "encode_completion": _SDK["bridge_worker"].encode_completion,
    }
)


class _Target:
    """One place the SDK's passes would visit: a payload or a payload
    sequence (a repeated field, written back in place), and its command."""

    __slots__ = ("carry", "command", "payloads", "single")

    def __init__(self, command: Any, payloads: Any, single: bool, carry: bool = False) -> None:
        self.command = command
        self.payloads = payloads
        self.single = single
        self.carry = carry  # the input of a run continued as new (``READING_CARRY``)

    def items(self) -> Sequence[Payload]:
        return [self.payloads] if self.single else self.payloads

    async def apply(self, step: Step) -> None:
        token = _SDK["command"].set(self.command) if _SDK else None
        carry = READING_CARRY.set(True) if self.carry else None
        try:
            if self.single:
                new = (await step([self.payloads]))[0]
                if new is not self.payloads:
                    self.payloads.CopyFrom(new)
                return
            old = list(self.payloads)
            new_payloads = await step(old)
            if len(new_payloads) == len(old) and all(a is b for a, b in zip(new_payloads, old, strict=True)):
                return  # nothing changed: no copy back
            del self.payloads[:]
            self.payloads.extend(new_payloads)
        finally:
            if carry is not None:
                READING_CARRY.reset(carry)
            if token is not None:
                _SDK["command"].reset(token)


def _collector() -> Any:
    base = _SDK["VisitorFunctions"] if _SDK else object

    class Collector(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.targets: list[_Target] = []
            self.envelope = False
            self.in_carry = False

        async def visit_payload(self, payload: Payload) -> None:
            self.targets.append(_Target(_SDK["command"].get(), payload, True, self.in_carry))

        async def visit_payloads(self, payloads: Any) -> None:
            if len(payloads):
                self.targets.append(_Target(_SDK["command"].get(), payloads, False, self.in_carry))

        async def visit_system_nexus_envelope(self, payload: Payload) -> None:
            self.envelope = True

    return Collector


_Collector = _collector()


def _visitor() -> Any:
    base = _SDK["Visitor"] if _SDK else object

    class Visitor(base):  # type: ignore[misc, valid-type]
        """The SDK's visitor, telling the collector which payloads are a
        run's input written by its conversation's own continue-as-new: the
        arguments only (a run continued by a retry or a cron schedule starts
        from the client's input; the memo, headers and the rest are bounded
        like any payload). The SDK's own visit, with that flag around the
        arguments (temporalio 1.35, as the rest of this module)."""

        async def _visit_coresdk_workflow_activation_InitializeWorkflow(self, fs: Any, o: Any) -> None:
            fs.in_carry = o.continued_initiator == _BY_THE_WORKFLOW
            try:
                await self._visit_payload_container(fs, o.arguments)
            finally:
                fs.in_carry = False
            if not self.skip_headers:
                for v in o.headers.values():
                    await self._visit_temporal_api_common_v1_Payload(fs, v)
            if o.HasField("continued_failure"):
                await self._visit_temporal_api_failure_v1_Failure(fs, o.continued_failure)
            if o.HasField("last_completion_result"):
                await self._visit_temporal_api_common_v1_Payloads(fs, o.last_completion_result)
            if o.HasField("memo"):
                await self._visit_temporal_api_common_v1_Memo(fs, o.memo)
            if o.HasField("search_attributes"):
                await self._visit_temporal_api_common_v1_SearchAttributes(fs, o.search_attributes)

    return Visitor


_BY_THE_WORKFLOW = ContinueAsNewInitiator.CONTINUE_AS_NEW_INITIATOR_WORKFLOW
_Visitor = _visitor()


async def _collect(root: Any, headers: bool) -> list[_Target] | None:
    """Every target in ``root``, in the SDK's visiting order; None when the
    tree holds a system Nexus envelope."""
    collector = _Collector()
    await _Visitor(skip_search_attributes=True, skip_headers=not headers).visit(collector, root)
    return None if collector.envelope else collector.targets


async def _each(step: Step, targets: Sequence[_Target]) -> None:
    for target in targets:
        await target.apply(step)


async def _bounded(step: Step, targets: Sequence[_Target], limit: int) -> None:
    """The storage step over the targets it acts on, at most ``limit`` at
    once (as the SDK's bounded visitor: the rest cancelled if one fails)."""
    if len(targets) <= 1 or limit <= 1:
        await _each(step, targets)
        return
    gate = asyncio.Semaphore(limit)

    async def one(target: _Target) -> None:
        async with gate:
            await target.apply(step)

    tasks = [asyncio.ensure_future(one(t)) for t in targets]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def decode_activation(
    activation: Any, data_converter: Any, decode_headers: bool, storage_concurrency_limit: int
) -> Any:
    """``temporalio.bridge.worker.decode_activation`` in one walk."""
    targets = await _collect(activation, decode_headers)
    if targets is None:
        return await _STOCK["decode_activation"](
            activation, data_converter, decode_headers, storage_concurrency_limit
        )
    if any(_SDK["has_marker"](p) for t in targets for p in t.items()):
        await _each(data_converter._decode_reference_payload_sequence, targets)
    metrics = _SDK["extstore"].StorageOperationMetrics()
    with metrics.track():
        # Without storage the step still runs on a reference: it raises
        # (TMPRL1105), failing the workflow task as the SDK's passes do.
        stored = [t for t in targets if any(_SDK["is_reference"](p) for p in t.items())]
        await _bounded(data_converter._external_retrieve_payload_sequence, stored, storage_concurrency_limit)
    if data_converter.payload_codec:
        await _each(data_converter._decode_payload_sequence, targets)
    if activation.is_replaying and any(refused_reason(p) is not None for t in targets for p in t.items()):
        refuse_unreadable_history(activation)
    return metrics


def refuse_unreadable_history(activation: Any) -> None:
    """Raise ``PayloadUnreadable`` for a payload this worker cannot read in
    a job of a replaying activation: the conversation read it before (a
    start input or an activity result it could not read failed the
    workflow then, and an update refused then is not in the history), so
    this worker lacks what that took. Signals are left to the SDK: one
    refused on its first read was dropped and is in the history, and a
    replay drops it again. Of a start, only its input counts: the workflow
    never reads its memo, headers or last result, so one of those this
    worker cannot read did not stop the first run and must not stop a
    replay (that wedged the conversation: a mutation audit)."""
    for job in activation.jobs:
        if job.HasField("signal_workflow"):
            continue
        if job.HasField("initialize_workflow"):
            reason = next(
                (r for p in job.initialize_workflow.arguments if (r := refused_reason(p)) is not None), None
            )
        else:
            reason = _refused_in(job)
        if reason is not None:
            raise PayloadUnreadable(
                f"A payload this conversation's history holds {reason} on this worker; the "
                "conversation goes on once the worker can read it (README: Running it in production)."
            )


def _refused_in(message: Any) -> str | None:
    """The reason of the first refused payload in ``message``, at any depth."""
    if isinstance(message, Payload):
        return refused_reason(message)
    for field, value in message.ListFields():
        if field.message_type is None:
            continue  # a scalar
        if isinstance(value, Message):
            children: list[Any] = [value]
        elif callable(getattr(value, "values", None)):
            children = list(value.values())  # a map
        else:
            children = list(value)  # a repeated field
        for child in children:
            if isinstance(child, Message):
                found = _refused_in(child)
                if found is not None:
                    return found
    return None


async def _checked_stock_decode(
    activation: Any, data_converter: Any, decode_headers: bool, storage_concurrency_limit: int
) -> Any:
    """The SDK's own passes (``AGENT_PAYLOAD_WALK=off``, the fallbacks),
    then the same check of a replay's refused payloads (a serialized
    activation holds the refused encoding's name only when one is there)."""
    metrics = await _STOCK["decode_activation"](
        activation, data_converter, decode_headers, storage_concurrency_limit
    )
    if activation.is_replaying and REFUSED in activation.SerializeToString():
        refuse_unreadable_history(activation)
    return metrics


async def encode_completion(
    completion: Any, data_converter: Any, encode_headers: bool, storage_concurrency_limit: int
) -> Any:
    """``temporalio.bridge.worker.encode_completion`` in one walk."""
    targets = await _collect(completion, encode_headers)
    if targets is None:
        return await _STOCK["encode_completion"](
            completion, data_converter, encode_headers, storage_concurrency_limit
        )
    if data_converter.payload_codec:
        await _each(data_converter._encode_payload_sequence, targets)
    metrics = _SDK["extstore"].StorageOperationMetrics()
    storage = data_converter.external_storage
    with metrics.track():
        if storage:
            threshold = storage.payload_size_threshold
            large = [t for t in targets if any(p.ByteSize() >= threshold for p in t.items())]
            await _bounded(data_converter._external_store_payload_sequence, large, storage_concurrency_limit)
    if _SDK["extstore"]._ENCODE_STORAGE_REFERENCES and data_converter.payload_codec:
        await _each(data_converter._encode_reference_payload_sequence, targets)
    return metrics


def install(enabled: bool = True) -> bool:
    """Use the one-walk versions in this process (``enabled``), or the SDK's
    own. Returns whether the one-walk versions are in use."""
    if _SDK is None:
        if enabled:
            log.warning(
                "temporalio %s is not %s (or its payload visitor moved): workflow tasks' payloads "
                "are walked by the SDK's own passes (slower per workflow task)",
                version("temporalio"),
                SUPPORTED_SDK,
            )
        return False
    module = _SDK["bridge_worker"]
    module.decode_activation = decode_activation if enabled else _checked_stock_decode
    module.encode_completion = encode_completion if enabled else _STOCK["encode_completion"]
    return enabled
