"""`JudgeReward`: an LLM grades the final answer.

The judge is any async callable ``generate(messages) -> str`` (`JudgeGenerate`): agent-runtime's engines fit,
and so does a plain HTTP client or a test fake, so this layer never imports an engine. The judge is asked
for a last line ``SCORE: <number between 0 and 1>`` (``SCORE: 7/10`` is read as 0.7); the last such line
counts.

A judge that fails never raises out of `score`: the strategy returns `fallback_score` (default 0.0) and a
code:

==================  ==============================================================
code                meaning
==================  ==============================================================
judge_timeout       the judge did not answer within `timeout_s`
judge_error         the judge raised (type and message in `detail`)
judge_unparseable   the reply had no SCORE line, or its score was outside 0-1
==================  ==============================================================

This module knows the protocol's `Message`; it knows nothing about engines.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Final

from agent_env.reward import EpisodeRecord, ResultRewardStrategy, RewardScore
from agent_protocol import Message

__all__ = ["DEFAULT_JUDGE_SYSTEM_PROMPT", "DEFAULT_JUDGE_TEMPLATE", "JudgeGenerate", "JudgeReward", "parse_judge_score"]

JudgeGenerate = Callable[[list[Message]], Awaitable[str]]

DEFAULT_JUDGE_SYSTEM_PROMPT: Final = (
    "You grade answers. Compare the candidate answer with the reference answer for the question. Judge "
    "meaning, not wording. Explain briefly, then end with a line of the form\nSCORE: <number from 0 to 1>\n"
    "where 1 means fully correct and 0 means wrong."
)
DEFAULT_JUDGE_TEMPLATE: Final = "Question:\n{question}\n\nReference answer:\n{reference}\n\nCandidate answer:\n{answer}"

_SCORE_LINE: Final = re.compile(
    r"score\s*\**\s*[:=]\s*\**\s*(?P<value>[-+]?\d+(?:\.\d+)?)(?:\s*/\s*(?P<scale>\d+(?:\.\d+)?))?",
    re.IGNORECASE,
)


def parse_judge_score(reply: str) -> float | None:
    """The score of the last ``SCORE: x`` (or ``SCORE: x/n``) in `reply`, if it lies in [0, 1]."""
    matches = list(_SCORE_LINE.finditer(reply))
    if not matches:
        return None
    last = matches[-1]
    value = float(last.group("value"))
    scale = last.group("scale")
    if scale is not None:
        if float(scale) <= 0:
            return None
        value /= float(scale)
    return value if 0.0 <= value <= 1.0 else None


class JudgeReward(ResultRewardStrategy):
    """LLM-as-judge. See the module docstring for the reply format and the fallback codes."""

    name = "judge"

    def __init__(
        self,
        generate: JudgeGenerate,
        *,
        system_prompt: str = DEFAULT_JUDGE_SYSTEM_PROMPT,
        template: str = DEFAULT_JUDGE_TEMPLATE,
        fallback_score: float = 0.0,
        timeout_s: float = 60.0,
        name: str | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        for field in ("{question}", "{reference}", "{answer}"):
            if field not in template:
                raise ValueError(f"the judge template must contain {field}")
        self.generate = generate
        self.system_prompt = system_prompt
        self.template = template
        self.fallback = fallback_score
        self.timeout_s = timeout_s
        if name:
            self.name = name

    def messages(self, episode: EpisodeRecord) -> list[Message]:
        """The conversation sent to the judge."""
        reference = "\n".join(episode.references) if episode.references else "(no reference given)"
        user = self.template.format(question=episode.question, reference=reference, answer=episode.answer)
        return [Message(role="system", content=self.system_prompt), Message(role="user", content=user)]

    async def score(self, episode: EpisodeRecord) -> RewardScore:
        try:
            async with asyncio.timeout(self.timeout_s):
                reply = await self.generate(self.messages(episode))
        except TimeoutError:
            return RewardScore(value=self.fallback, code="judge_timeout")
        except Exception as e:
            return RewardScore(value=self.fallback, code="judge_error", detail=f"{type(e).__name__}: {e}"[:500])
        value = parse_judge_score(reply) if isinstance(reply, str) else None
        if value is None:
            shown = reply if isinstance(reply, str) else repr(reply)
            return RewardScore(value=self.fallback, code="judge_unparseable", detail=shown[-300:])
        return RewardScore(value=value)
