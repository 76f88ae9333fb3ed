"""The scripted expert of the compaction demo (`agent_demo.running_total`): a `ScriptedEngine` policy that adds
the list up one calculator call at a time and, when the session asks for a summary, writes the one that carries
the episode on. Its episodes, run through the recipe's own session (its `CompactionPolicy`), are the SFT data, so
the expert compacts exactly where the session's threshold asks a model to.

    engine = ScriptedEngine(tokenizer, policy=RunningTotalExpert(tokenizer, protocol))

It reads only the current context, as a model must: the question (the list), the summary this context resumed
from if any, its own calls in this context and the last tool result. Its turns:

- the first call of an episode adds the first two numbers (``4 + 7``); each later one adds the number after the
  last one added to the tool's last result (``11 + 1``); the first call of a resumed context adds the first
  number the summary lists as left to its total;
- the summary, when the last user turn is the compaction instruction: ``Total 12. Left: 38256.``;
- the answer, once the last number is added (or the summary left none): ``The answer is 45.``;
- anything it cannot read (not this task, a failed tool call): a short refusal that ends the episode.

`episode_pieces` is the text of an expert episode in the pieces a session tokenizes one by one, compacting every
few calls: the corpus of the demo's tokenizer (`train_running_total_tokenizer`). This module knows the task and
the chat protocol's text; it knows nothing about training.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Final

from tokenizers import Tokenizer

from agent_demo.running_total import (
    COMPACTION_INSTRUCTION,
    RESUME_TEMPLATE,
    TotalProblem,
    generate_totals,
    parse_numbers,
    summary_text,
)
from agent_demo.tokenizer import train_piece_tokenizer
from agent_protocol import ChatProtocol, Message, ToolCall, ToolSpecLike
from agent_protocol import Tokenizer as TextTokenizer

__all__ = ["REFUSAL", "RunningTotalExpert", "episode_pieces", "expert_turn", "train_running_total_tokenizer"]

REFUSAL: Final = "I can only add up a list of numbers with the calculator."
_USER_TURN: Final = "<|im_start|>user\n"
_END: Final = "<|im_end|>"
_CALL: Final = re.compile(r'"expression": "(?P<total>[0-9]+) \+ (?P<added>[0-9]+)"')
_TOOL_RESPONSE: Final = re.compile(r"<tool_response>\n(?P<content>.*?)\n</tool_response>", re.DOTALL)
_RESUMED: Final = re.compile(
    re.escape(RESUME_TEMPLATE.format(summary="")) + r"Total (?P<total>[0-9]+)\. Left: (?P<left>[1-9]+|none)\."
)


def _user_turns(context: str) -> list[str]:
    return [part.split(_END)[0] for part in context.split(_USER_TURN)[1:]]


def _state(context: str) -> tuple[tuple[int, ...], int, int] | None:
    """What the context says: the list, the total so far and the index of the next number to add (None when it
    cannot be read)."""
    turns = _user_turns(context)
    numbers = parse_numbers(turns[0]) if turns else None
    if not numbers or len(numbers) < 2:
        return None
    calls = _CALL.findall(context)
    results = [r.strip() for r in _TOOL_RESPONSE.findall(context)]
    if calls:
        added = int(calls[-1][1])
        if added not in numbers or not results or not results[-1].isdigit():
            return None
        return numbers, int(results[-1]), numbers.index(added) + 1
    resumed = _RESUMED.search(context)
    if resumed is not None:
        left = [] if resumed["left"] == "none" else [int(n) for n in resumed["left"]]
        return numbers, int(resumed["total"]), len(numbers) - len(left)
    return numbers, numbers[0], 1


def expert_turn(context: str, protocol: ChatProtocol) -> str:
    """The expert's next assistant turn (text, end-of-turn token included) for a rendered context."""
    state = _state(context)
    if state is None:
        return protocol.render_generation(Message(role="assistant", content=REFUSAL))
    numbers, total, following = state
    last_user = _user_turns(context)[-1]
    if COMPACTION_INSTRUCTION in last_user:
        return protocol.render_generation(Message(role="assistant", content=summary_text(total, numbers[following:])))
    if following >= len(numbers):
        return protocol.render_generation(Message(role="assistant", content=f"The answer is {total}."))
    call = ToolCall(id="call_0", name="calculator", arguments={"expression": f"{total} + {numbers[following]}"})
    return protocol.render_generation(Message(role="assistant", content="", tool_calls=(call,)))


class RunningTotalExpert:
    """`ScriptedEngine(policy=...)`: prompt ids in, the expert's turn (text) out."""

    def __init__(self, tokenizer: TextTokenizer, protocol: ChatProtocol) -> None:
        self.tokenizer = tokenizer
        self.protocol = protocol

    def __call__(self, prompt_ids: Sequence[int]) -> str:
        return expert_turn(self.tokenizer.decode(prompt_ids), self.protocol)


def episode_pieces(
    problem: TotalProblem, protocol: ChatProtocol, tools: Sequence[ToolSpecLike], rng: random.Random
) -> list[str]:
    """The texts of an expert episode on `problem` in the pieces a session tokenizes one by one (prompts, turns,
    feedback), compacting after every two to four calls (where the session compacts depends on the tokenizer
    this corpus trains, so the corpus only has to show every kind of piece)."""
    question = Message(role="user", content=problem.question)
    context = protocol.render_prompt([question], tools=tools)
    pieces = [context]
    calls_in_context, compact_after = 0, rng.randint(2, 4)
    while True:
        turn = expert_turn(context, protocol)
        pieces.append(turn)
        context += turn
        result = _CALL.search(turn)
        if result is None:
            return pieces
        calls_in_context += 1
        tool = Message(role="tool", content=str(int(result["total"]) + int(result["added"])), tool_call_id="call_0")
        compact = calls_in_context >= compact_after
        feedback_messages = [tool, Message(role="user", content=COMPACTION_INSTRUCTION)] if compact else [tool]
        feedback = protocol.render_feedback(feedback_messages)
        pieces.append(feedback)
        context += feedback
        if compact:
            summary = expert_turn(context, protocol)
            pieces.append(summary)
            content = protocol.parse_assistant_text(summary.removesuffix(_END)).content.strip()
            resume = Message(role="user", content=RESUME_TEMPLATE.format(summary=content))
            context = protocol.render_prompt([question, resume], tools=tools)
            pieces.append(context)
            calls_in_context, compact_after = 0, rng.randint(2, 4)


def train_running_total_tokenizer(
    protocol: ChatProtocol,
    tools: Sequence[ToolSpecLike],
    *,
    vocab_size: int = 1024,
    episodes: int = 3000,
    seed: int = 0,
) -> Tokenizer:
    """The compaction demo's tokenizer: `agent_demo.tokenizer`'s design (every digit its own token), trained on
    `episodes` expert episodes of this task (training lists)."""
    rng = random.Random(f"running-total-corpus:{seed}")
    problems = generate_totals("train", episodes, seed=seed)
    texts = [piece for problem in problems for piece in episode_pieces(problem, protocol, tools, rng)]
    return train_piece_tokenizer(texts, vocab_size=vocab_size)
