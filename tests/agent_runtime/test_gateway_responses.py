"""The Responses API through the listening gateway: a session's ``/sessions/{id}/v1/responses`` is the same app's
route, streamed through as it is generated; the SDK's items continue the stored ids across the session's turns,
each Responses call counts as a model call of the episode (`AgentProgram.max_requests`), and a key opens only its
own session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agent_protocol import HFTokenizer
from agent_runtime.proxy import Gateway, GatewaySession
from tests.agent_runtime.test_proxy_gateway import bearer, on_gateway


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


TOOL: Any = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


def test_a_session_serves_the_responses_api_streamed_and_continues_the_ids(tokenizer: HFTokenizer) -> None:
    async def scenario(gateway: Gateway, sessions: list[GatewaySession], http: httpx.AsyncClient) -> Any:
        a, b = sessions
        async with openai.AsyncOpenAI(base_url=a.base_url, api_key=a.key, max_retries=0) as client:
            items: list[Any] = [{"role": "user", "content": "What is 17 * 23?"}]
            async with client.responses.stream(model="policy", input=items, tools=[TOOL]) as stream:
                kinds = [event.type async for event in stream]
                first = await stream.get_final_response()
            call = first.output[-1]
            assert call.type == "function_call" and json.loads(call.arguments) == {"expression": "17 * 23"}
            items += [item.model_dump(exclude_none=True) for item in first.output]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "391"})
            second = await client.responses.create(model="policy", input=items, tools=[TOOL])
        wrong_key = await http.post(f"{b.base_url}/responses", json={"model": "policy", "input": "hi"},
                                    headers=bearer(a))  # fmt: skip
        return kinds, second, wrong_key, a.endpoint

    kinds, second, wrong_key, endpoint = on_gateway(tokenizer, scenario)
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert second.output_text == "The answer is 391."
    assert endpoint.requests == 2  # both Responses calls counted as the episode's model calls
    metrics = endpoint.app.state.backend.metrics
    assert metrics.transcript_prefix_hits == 1 and metrics.transcript_rerenders == 0
    assert wrong_key.status_code == 401
