"""A plain agent written against the OpenAI API: a loop that asks the model, runs the calculator calls it makes,
sends the results back and returns the model's last text. Nothing in it knows about training.

    client = openai.AsyncOpenAI(base_url="http://localhost:8000/v1", api_key="...")
    answer = await calculator_agent(client, ProgramTask(prompt="What is 17 * 23?", model="demo-calculator"))

It is the kind of agent people already have: its own tool (a small arithmetic evaluator over Python's `ast`), its
own tool schema, its own loop. Trained, it runs unchanged: the trainer hands it a client whose endpoint is the
policy (`agent_runtime.proxy`). It echoes each assistant message back as the API returned it, so every follow-up
continues the model's sampled token ids exactly. The tool, its schema and the turn limit are those of
`subprocess_agent.py` (the same loop as a script of its own, which may import only `openai` and the standard
library), so the two agents cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from agent_runtime.agent_program import ProgramTask
from examples.any_agent.subprocess_agent import CALCULATOR_TOOL, MAX_TURNS, calculate

__all__ = ["CALCULATOR_TOOL", "MAX_TURNS", "calculate", "calculator_agent"]


async def calculator_agent(client: Any, task: ProgramTask) -> str | None:
    """Ask, run the calculator calls, repeat; the model's first reply without tool calls is the answer."""
    messages = task.messages
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR_TOOL])
        message = response.choices[0].message
        if not message.tool_calls:
            return str(message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    return None
