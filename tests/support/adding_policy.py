"""A scripted agent that adds a list of numbers with the calculator, one call per number, reading each prompt:
the question's numbers, the tool calls it already made and the last tool result (the latest one is always in the
prompt, whatever older results a context policy dropped). A `ScriptedEngine` policy, for real Qwen3 ids."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from agent_protocol import Tokenizer
from tests.support.calculator_policy import answer_text, tool_call_text

__all__ = ["adding_policy"]

_RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


def adding_policy(tokenizer: Tokenizer) -> Callable[[Sequence[int]], str]:
    def policy(prompt_ids: Sequence[int]) -> str:
        blocks = [raw.partition("\n")[::2] for raw in tokenizer.decode(prompt_ids).split("<|im_start|>")[1:]]
        question = next((body for role, body in blocks if role == "user"), "")
        numbers = re.findall(r"\d+", question)
        calls = sum(body.count("<tool_call>") for role, body in blocks if role == "assistant")
        results = [r for role, body in blocks if role == "user" for r in _RESULT.findall(body)]
        last = results[-1] if results else numbers[0]
        if calls + 1 < len(numbers):
            return tool_call_text(f"{last} + {numbers[calls + 1]}")
        return answer_text(f"The answer is {json.loads(last) if last.isdigit() else last}.")

    return policy
