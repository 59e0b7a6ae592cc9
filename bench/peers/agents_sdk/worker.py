"""The OpenAI Agents SDK row's worker: the plugin with a model provider on
the scripted server's Chat Completions endpoint (it has no Responses API),
tracing off (it would export to OpenAI's servers).

    python -m bench.peers.agents_sdk.worker --address ... --task-queue ... --model-base-url ...
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from agents import OpenAIProvider, set_tracing_disabled
from openai import AsyncOpenAI
from temporalio.client import Client
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
from temporalio.worker import Worker

from bench.peers.agents_sdk.activities import calculator
from bench.peers.agents_sdk.models import EVENTS_TOPIC
from bench.peers.agents_sdk.workflows import AgentsSdkConversation
from bench.peers.serve import run_until_terminated, worker_arguments


def plugin(model_base_url: str | None = None) -> OpenAIAgentsPlugin:
    """The plugin as the worker and the client configure it (the client needs
    only its data converter)."""
    set_tracing_disabled(True)
    provider = None
    if model_base_url:
        model_client = AsyncOpenAI(base_url=model_base_url, api_key="bench", max_retries=0)
        provider = OpenAIProvider(openai_client=model_client, use_responses=False)
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(
            start_to_close_timeout=timedelta(seconds=60), streaming_topic=EVENTS_TOPIC
        ),
        model_provider=provider,
    )


async def main() -> None:
    args = worker_arguments(__doc__ or "")
    client = await Client.connect(args.address, plugins=[plugin(args.model_base_url)])
    worker = Worker(
        client, task_queue=args.task_queue, workflows=[AgentsSdkConversation], activities=[calculator]
    )
    await run_until_terminated(worker)


if __name__ == "__main__":
    asyncio.run(main())
