"""The floor's worker: ``python -m bench.peers.floor.worker --address ...``."""

from __future__ import annotations

import asyncio

import openai
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from bench.peers.floor.activities import FloorActivities
from bench.peers.floor.workflows import FloorConversation
from bench.peers.serve import run_until_terminated, worker_arguments


async def main() -> None:
    args = worker_arguments(__doc__ or "")
    client = await Client.connect(args.address, data_converter=pydantic_data_converter)
    model = openai.AsyncOpenAI(base_url=args.model_base_url, api_key="bench", max_retries=0)
    activities = FloorActivities(model)
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[FloorConversation],
        activities=[activities.call_model, activities.run_tool],
    )
    await run_until_terminated(worker)


if __name__ == "__main__":
    asyncio.run(main())
