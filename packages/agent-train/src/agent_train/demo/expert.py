"""The scripted expert of the demo task: a policy for `ScriptedEngine` that answers the prompts it can read as a
perfect agent would, so supervised data is produced by the same `AgentSession` that serves and trains the model.

    engine = ScriptedEngine(tokenizer, policy=ExpertPolicy(tokenizer, protocol))

Given the prompt ids of the current context, the expert decodes them and looks at the last user turn:

- a question of the task in a *plain* phrasing ("What is 347 * 829 + 56?", "Compute 347 times 829, then add
  56."): it calls ``calculator`` with the canonical expression (one tool call);
- a tool response: it answers ``The answer is N.`` with N copied from the tool's result;
- anything else (a *word* problem, a question outside the task, a failed tool call): a short refusal that ends
  the episode. Refused episodes earn no reward, and SFT keeps solved episodes only, so it never shows a word
  problem.

The expert's blind spot is deliberate and is what the demo's RL phase is for: demonstrations teach the tool-call
format, copying digits and the operator of plain phrasings; word problems, where the verb before the third number
says whether to add or subtract, are learned from the reward alone. `expert_turn(..., phrasings=("plain",
"word"))` is the all-knowing version (the tokenizer's corpus and tests use it).

Its turns are rendered by the protocol (`render_generation`), so they end with the end-of-turn token exactly as
a model's would; the engine tokenizes them once. This module knows the demo task and the chat protocol's text;
it knows nothing about training.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from agent_protocol import ChatProtocol, Message, Tokenizer, ToolCall
from agent_train.demo.task import Phrasing, parse_question

__all__ = ["DEMONSTRATED", "REFUSAL", "ExpertPolicy", "expert_turn"]

DEMONSTRATED: Final[tuple[Phrasing, ...]] = ("plain",)
"""The phrasings the scripted expert reads (and so the only ones supervised data shows)."""

_USER_TURN: Final = "<|im_start|>user\n"
_TOOL_RESPONSE: Final = re.compile(r"<tool_response>\n(?P<content>.*?)\n</tool_response>", re.DOTALL)
_INTEGER: Final = re.compile(r"-?[0-9]+")
REFUSAL: Final = "I can only compute expressions of the form a * b + c with the calculator."


def expert_turn(context: str, protocol: ChatProtocol, *, phrasings: tuple[Phrasing, ...] = DEMONSTRATED) -> str:
    """The expert's next assistant turn (text, end-of-turn token included) for a rendered `context`; it reads the
    questions of the given `phrasings` (default: plain ones only) and refuses the others."""
    start = context.rfind(_USER_TURN)
    last_user = context[start + len(_USER_TURN) :] if start >= 0 else ""
    last_user = last_user.split("<|im_end|>")[0]
    responses = _TOOL_RESPONSE.findall(last_user)
    if responses:
        result = responses[-1].strip()
        if _INTEGER.fullmatch(result):
            return protocol.render_generation(Message(role="assistant", content=f"The answer is {result}."))
        return protocol.render_generation(Message(role="assistant", content=REFUSAL))
    problem = parse_question(last_user, phrasings=phrasings)
    if problem is None:
        return protocol.render_generation(Message(role="assistant", content=REFUSAL))
    call = ToolCall(id="call_0", name="calculator", arguments={"expression": problem.expression})
    return protocol.render_generation(Message(role="assistant", content="", tool_calls=(call,)))


class ExpertPolicy:
    """`ScriptedEngine(policy=...)`: prompt ids in, the expert's turn (text) out."""

    def __init__(
        self, tokenizer: Tokenizer, protocol: ChatProtocol, *, phrasings: tuple[Phrasing, ...] = DEMONSTRATED
    ) -> None:
        self.tokenizer = tokenizer
        self.protocol = protocol
        self.phrasings = phrasings

    def __call__(self, prompt_ids: Sequence[int]) -> str:
        return expert_turn(self.tokenizer.decode(prompt_ids), self.protocol, phrasings=self.phrasings)
