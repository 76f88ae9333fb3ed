"""A plain agent written against the OpenAI API: a loop that asks the model, runs the calculator calls it makes,
sends the results back and returns the model's last text. Nothing in it knows about training.

    client = openai.AsyncOpenAI(base_url="http://localhost:8000/v1", api_key="...")
    answer = await calculator_agent(client, ProgramTask(prompt="What is 17 * 23?", model="demo-calculator"))

It is the kind of agent people already have: its own tool (a small arithmetic evaluator over Python's `ast`), its
own tool schema, its own loop. Trained, it runs unchanged: the trainer hands it a client whose endpoint is the
policy (`agent_runtime.proxy`). It echoes each assistant message back as the API returned it, so every follow-up
continues the model's sampled token ids exactly.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Callable
from typing import Any, Final

from agent_runtime.agent_program import ProgramTask

__all__ = ["CALCULATOR_TOOL", "MAX_TURNS", "calculate", "calculator_agent"]

MAX_TURNS: Final = 3  # model turns per episode, as the demo recipe's environment allows

CALCULATOR_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression exactly: integers and decimals with + - * / ** and parentheses. "
            "Returns an integer, an exact decimal, or a fraction p/q with an approximation."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "description": "An arithmetic expression, e.g. (3 + 4.5) * 2 / 7 or 2**10.",
                    "type": "string",
                }
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}

_OPERATORS: Final[dict[type, Callable[[int, int], int]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only integers with + - * are supported")


def calculate(arguments: str) -> str:
    """The tool: ``{"expression": "17 * 23"}`` -> ``"391"``; a bad call gets an error text the model can read."""
    try:
        expression = json.loads(arguments)["expression"]
        if not isinstance(expression, str) or len(expression) > 200:
            raise ValueError("expression must be a string of at most 200 characters")
        return str(_value(ast.parse(expression, mode="eval").body))
    except (ValueError, KeyError, TypeError, SyntaxError) as e:
        return f"error: {e}"


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
