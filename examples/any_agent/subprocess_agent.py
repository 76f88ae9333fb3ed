"""The agent of `agent.py` as a program of its own: a script that knows nothing about training, imports only the
synchronous `openai` client and the standard library, and takes what it needs from its environment.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=... OPENAI_MODEL=demo-calculator \\
        python examples/any_agent/subprocess_agent.py "What is 17 * 23?"

Without an argument it reads its task from stdin: a JSON object with a ``prompt`` (a string or chat messages) and
an optional ``model``, as the trainer sends it (`AgentProgram.command`). It prints its answer as the last line of
its stdout. The tool schema, the evaluator and the turn limit are defined here, where only the standard library is
at hand, and `agent.py` (the same loop for an `openai.AsyncOpenAI`) imports them from here.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys
from collections.abc import Callable
from typing import Any, Final

import openai

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


def calculator_agent(client: openai.OpenAI, model: str, messages: list[dict[str, Any]]) -> str | None:
    """Ask, run the calculator calls, repeat; the model's first reply without tool calls is the answer."""
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR_TOOL])
        message = response.choices[0].message
        if not message.tool_calls:
            return str(message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = call.function.arguments
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(arguments)})
    return None


def main() -> int:
    task = {"prompt": sys.argv[1]} if len(sys.argv) > 1 else json.loads(sys.stdin.read())
    prompt = task["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    model = os.environ.get("OPENAI_MODEL") or task.get("model") or "policy"
    client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    try:
        answer = calculator_agent(client, model, messages)
    finally:
        client.close()
    print("" if answer is None else answer.replace("\n", " "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
