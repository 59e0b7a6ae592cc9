"""The model activity's set-up on a worker: its client is made when the
worker starts (the first answer after a start or a crash does not wait for
it), and a worker without an API key says so on the call."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.llm import LlmActivities
from workflows.contract import LlmRequest
from workflows.models import UserMessage

REQUEST = LlmRequest(model="m", messages=[UserMessage(content="hi", timestamp=0)], turn=1)


async def test_without_an_api_key_the_call_says_what_to_set() -> None:
    llm = LlmActivities(api_key=None)
    llm.warm_up()  # nothing to make: no key
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(llm.stream_assistant_response, REQUEST)
    assert raised.value.type == "ModelConfigError"
    assert raised.value.non_retryable
    assert "OPENAI_API_KEY is not set on the worker" in str(raised.value)


def test_the_model_client_is_made_at_start_once(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    real = openai.AsyncOpenAI

    def counting(**kwargs: Any) -> openai.AsyncOpenAI:
        made.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(openai, "AsyncOpenAI", counting)
    llm = LlmActivities(api_key="k", base_url="http://127.0.0.1:9/v1")
    llm.warm_up()
    llm.warm_up()
    assert [m["base_url"] for m in made] == ["http://127.0.0.1:9/v1"]
    assert made[0]["max_retries"] == 0  # Temporal retries, not the client
