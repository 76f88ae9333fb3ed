"""A scripted calculator agent: a `ScriptedEngine` policy that answers each Qwen3 prompt by reading it.

It behaves like a model trained on the calculator task, so the server can be tested end to end with real token
ids and the real calculator tool, many conversations at once, none able to borrow another's answer:

- a user question holding ``A op B`` (op one of + - *) -> a `calculator` tool call with that expression;
- a turn after tool results -> "The answer is R." where R is the last result; if the question contains
  "explode", the engine raises `EngineError` instead (an engine failing mid-episode);
- the compaction instruction -> a summary naming the question and the last result;
- a resumed context ("Summary of your work ...") -> the answer from the summary;
- anything else -> a plain reply without tools.

Public API: `calculator_policy(tokenizer)`, `CALCULATOR_TOOL` (the tool's OpenAI spec, for tools mode).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from agent_protocol import Tokenizer
from agent_runtime import EngineError

__all__ = ["CALCULATOR_TOOL", "answer_text", "calculator_policy", "tool_call_text"]

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_EXPRESSION = re.compile(r"(-?\d+(?:\.\d+)?)\s*([-+*])\s*(-?\d+(?:\.\d+)?)")
_RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_SUMMARY_RESULT = re.compile(r"the calculator gave (.+?)\.$", re.M)


def tool_call_text(expression: str) -> str:
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<think>\nI should use the calculator.\n</think>\n\n<tool_call>\n{payload}\n</tool_call><|im_end|>"


def answer_text(text: str, reasoning: str = "The tool answered.") -> str:
    return f"<think>\n{reasoning}\n</think>\n\n{text}<|im_end|>"


def _blocks(prompt: str) -> list[tuple[str, str]]:
    out = []
    for raw in prompt.split("<|im_start|>")[1:]:
        role, _, body = raw.partition("\n")
        out.append((role, body.split("<|im_end|>")[0]))
    return out


def _is_question(role: str, body: str) -> bool:
    return role == "user" and not body.startswith(("<tool_response>", "Summary of your work", "Your context is"))


def calculator_policy(tokenizer: Tokenizer) -> Callable[[Sequence[int]], str]:
    im_start = tokenizer.token_to_id("<|im_start|>")
    if im_start is None:
        raise ValueError("the calculator policy reads ChatML prompts: the tokenizer has no <|im_start|> token")
    system_opening = [im_start, *tokenizer.encode("system\n")]

    def conversation_ids(prompt_ids: Sequence[int]) -> list[int]:
        """The prompt after its system block: the policy never reads the system prompt or the tool listing (most
        of a prompt's ids), so it does not decode them (the stand-in for a model should not weigh on the server
        CPU that `bench/bench_serve.py` measures)."""
        ids = list(prompt_ids)
        if ids[: len(system_opening)] != system_opening:
            return ids
        try:
            return ids[ids.index(im_start, 1) :]
        except ValueError:  # the system block alone
            return []

    def policy(prompt_ids: Sequence[int]) -> str:
        blocks = _blocks(tokenizer.decode(conversation_ids(prompt_ids)))
        role, body = blocks[-2] if len(blocks) >= 2 else ("user", "")
        question = next((b for r, b in reversed(blocks) if _is_question(r, b)), "")
        results = [r for _, b in blocks for r in _RESULT.findall(b)]
        if body.startswith("Your context is"):
            last = results[-1] if results else "nothing"
            return answer_text(f"The question was: {question}\nSo far the calculator gave {last}.", "Summarize.")
        if body.startswith("Summary of your work"):
            found = _SUMMARY_RESULT.search(body)
            return answer_text(f"The answer is {found.group(1) if found else 'unknown'}.", "From the summary.")
        if role == "user" and body.startswith("<tool_response>"):
            if "explode" in question:
                raise EngineError("the scripted engine failed on purpose (the question asked it to explode)")
            return answer_text(f"The answer is {results[-1]}.")
        match = _EXPRESSION.search(question)
        if match is None:
            return answer_text("I can only help with arithmetic.", "No arithmetic here.")
        return tool_call_text(" ".join(match.groups()))

    return policy
