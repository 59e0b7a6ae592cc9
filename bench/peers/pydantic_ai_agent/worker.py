"""The pydantic-ai row's worker. The scripted server's URL reaches the
model through the environment (``OPENAI_BASE_URL``), which the benchmark
sets for this process: pydantic-ai's OpenAI provider reads it.

    python -m bench.peers.pydantic_ai_agent.worker --address ... --task-queue ... --model-base-url ...
"""

from __future__ import annotations

import asyncio

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from bench.peers.pydantic_ai_agent.workflows import PydanticAiConversation, PydanticAiStreamedConversation
from bench.peers.serve import run_until_terminated, worker_arguments


async def main() -> None:
    args = worker_arguments(__doc__ or "")
    client = await Client.connect(args.address, plugins=[PydanticAIPlugin()])
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[PydanticAiConversation, PydanticAiStreamedConversation],
    )
    await run_until_terminated(worker)


if __name__ == "__main__":
    asyncio.run(main())
