"""The scripted expert of the demo task: a policy for `ScriptedEngine` that answers the prompts it can read as a
perfect agent would, so supervised data is produced by the same `AgentSession` that serves and trains the model.

    engine = ScriptedEngine(tokenizer, policy=ExpertPolicy(tokenizer, protocol))

Given the prompt ids of the current context, the expert decodes them and looks at the last user turn:

- a question of the task in a *plain* phrasing ("What is 347 * 829 + 56?", "Compute 347 times 829, then add
  56."): it states its plan, ``Step 1: multiply. Step 2: add.`` (or ``subtract``), and calls ``calculator``
  with the canonical expression in the same turn (one tool call);
- a tool response: it answers ``The answer is N.`` with N copied from the tool's result;
- anything else (a *word* problem, a question outside the task, a failed tool call): a short refusal that ends
  the episode. Refused episodes earn no reward, and SFT keeps solved episodes only, so it never shows a word
  problem.

The expert's blind spot is deliberate and is what the demo's RL phase is for: demonstrations teach the tool-call
format, copying digits and the operator of plain phrasings; word problems, where the verb before the third number
says whether to add or subtract, are learned from the reward alone. `expert_turn(..., phrasings=("plain",
"word"))` is the all-knowing version (the tokenizer's corpus and tests use it).

Why a plan, and why this one. The task turns on one decision, add or subtract. Without a plan the model makes it in
the middle of the expression, where finding the question's operator means matching digits that recur everywhere:
after SFT the tiny model gave the right operator a probability of 0.50 on every plain question (seed 2), and RL
learned the operator at some seeds only. In the plan the decision is one token (``: add.`` or ``: subtract.`` with
the line break; the demo tokenizer never merges across a digit) after a fixed prefix, and it is a lookup of the one
operator or verb in the question. The fixed prefix matters: a plan whose first token carried the decision
(``Multiply, then add.``) left the model with no valid call at all on word problems after SFT, so RL had no reward
to learn from.

Its turns are rendered by the protocol (`render_generation`), so they end with the end-of-turn token exactly as
a model's would; the engine tokenizes them once. This module knows the demo task and the chat protocol's text;
it knows nothing about training.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from agent_demo.task import Phrasing, parse_question
from agent_protocol import ChatProtocol, Message, Tokenizer, ToolCall

__all__ = ["DEMONSTRATED", "PLAN_ADD", "PLAN_SUBTRACT", "REFUSAL", "ExpertPolicy", "expert_turn"]

DEMONSTRATED: Final[tuple[Phrasing, ...]] = ("plain",)
"""The phrasings the scripted expert reads (and so the only ones supervised data shows)."""

_USER_TURN: Final = "<|im_start|>user\n"
_TOOL_RESPONSE: Final = re.compile(r"<tool_response>\n(?P<content>.*?)\n</tool_response>", re.DOTALL)
_INTEGER: Final = re.compile(r"-?[0-9]+")
REFUSAL: Final = "I can only compute expressions of the form a * b + c with the calculator."
PLAN_ADD: Final = "Step 1: multiply. Step 2: add."
PLAN_SUBTRACT: Final = "Step 1: multiply. Step 2: subtract."


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
    plan = PLAN_ADD if problem.op == "+" else PLAN_SUBTRACT
    return protocol.render_generation(Message(role="assistant", content=plan, tool_calls=(call,)))


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
