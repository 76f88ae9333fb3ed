"""The same calculator agent written with the OpenAI Agents SDK (`openai-agents` on PyPI, imported as `agents`):
an `Agent` with one `FunctionTool`, run by `Runner.run` over the client it is given, on the SDK's Chat
Completions model (`sdk_calculator_agent`) or on its default, Responses API model (`OpenAIResponsesModel`:
`sdk_responses_calculator_agent`), which the server answers at ``/v1/responses`` from the same turn core. Nothing in
it knows about training.

    client = openai.AsyncOpenAI(base_url="http://localhost:8000/v1", api_key="...")
    answer = await sdk_calculator_agent(client, ProgramTask(prompt="What is 17 * 23?", model="demo-calculator"))

The tool has the plain loop's schema (`agent.CALCULATOR_TOOL`, not strict), so the model sees the same tool
listing whichever of the two agents runs. What the SDK does to the conversation between turns (it keeps its own
items and turns them back into chat messages, without the model's reasoning) is the proxy's to notice: the
reasoning it drops is the one case that still continues the sampled ids (`agent_runtime.proxy.prefix_break`).
On the Responses model the SDK sends its items back whole (reasoning items included), and each request carries
``store`` and ``include`` fields the server ignores: it keeps no responses, the items are the transcript.
Tracing is off: the SDK would otherwise send traces to OpenAI's servers.
"""

from __future__ import annotations

from typing import Any

from agent_runtime.agent_program import ProgramTask
from examples.any_agent.agent import CALCULATOR_TOOL, MAX_TURNS, calculate

__all__ = ["sdk_calculator_agent", "sdk_responses_calculator_agent"]


async def sdk_calculator_agent(client: Any, task: ProgramTask) -> str | None:
    """One `Runner.run` of a calculator `Agent` on `task.question`, on Chat Completions; its final output is the
    answer."""
    return await _run(client, task, responses=False)


async def sdk_responses_calculator_agent(client: Any, task: ProgramTask) -> str | None:
    """The same agent on the SDK's default model, `OpenAIResponsesModel` (``POST /v1/responses``)."""
    return await _run(client, task, responses=True)


async def _run(client: Any, task: ProgramTask, *, responses: bool) -> str | None:
    from agents import (
        Agent,
        FunctionTool,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)
    spec = CALCULATOR_TOOL["function"]

    async def run_calculator(_context: Any, arguments: str) -> str:
        return calculate(arguments)

    tool = FunctionTool(
        name=spec["name"],
        description=spec["description"],
        params_json_schema=spec["parameters"],
        on_invoke_tool=run_calculator,
        strict_json_schema=False,
    )
    if responses:
        model: Any = OpenAIResponsesModel(model=task.model, openai_client=client)
    else:
        model = OpenAIChatCompletionsModel(model=task.model, openai_client=client)
    agent = Agent(name="calculator", model=model, tools=[tool])
    try:
        result = await Runner.run(agent, task.messages, max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        return None  # no answer within the turns the demo allows, as the plain loop
    return None if result.final_output is None else str(result.final_output)
