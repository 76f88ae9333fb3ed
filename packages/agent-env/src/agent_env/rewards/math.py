"""`MathReward`: is the final answer mathematically equal to a reference? Decided by `math-verify`.

math-verify extracts the answer (``\\boxed{}`` first, then LaTeX and plain expressions) from the model's
text and from each reference, and compares them symbolically and numerically, so ``\\frac{1}{2}``, ``0.5``
and ``1/2`` agree, and so do ``x^2+1`` and ``1+x^2``. Score: 1.0 when any reference verifies, else 0.0.

math-verify's own timeouts use ``signal.alarm``, which only works on the main thread, so they are turned off
and the work runs on a daemon thread under this strategy's own `timeout_s` (a comparison that never ends is
abandoned, never awaited). Every failure is a score, not an exception:

======================  =============================================================
code                    meaning (value 0.0)
======================  =============================================================
no_reference            the episode has no reference answer
no_answer               nothing could be parsed from the model's answer
unparseable_reference   no reference could be parsed
math_verify_timeout     parsing or comparing took longer than `timeout_s`
math_verify_error       math-verify raised (the message is in `detail`)
======================  =============================================================

This module knows math-verify; it knows nothing about engines or environments.
"""

from __future__ import annotations

import asyncio
from typing import Any

from math_verify import parse, verify  # type: ignore[import-untyped]

from agent_env._threads import run_in_daemon_thread
from agent_env.reward import EpisodeRecord, ResultRewardStrategy, RewardScore

__all__ = ["MathReward"]


class MathReward(ResultRewardStrategy):
    """Mathematical equivalence of the final answer and a reference. See the module docstring."""

    name = "math"

    def __init__(self, *, timeout_s: float = 10.0, name: str | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        if name:
            self.name = name

    async def score(self, episode: EpisodeRecord) -> RewardScore:
        if not episode.references:
            return RewardScore(value=0.0, code="no_reference")
        answer, references = episode.answer, episode.references
        try:
            return await asyncio.wait_for(
                run_in_daemon_thread(lambda: _verify(answer, references), name="math-verify"),
                timeout=self.timeout_s,
            )
        except TimeoutError:
            return RewardScore(value=0.0, code="math_verify_timeout")
        except Exception as e:
            return RewardScore(value=0.0, code="math_verify_error", detail=f"{type(e).__name__}: {e}"[:500])


def _parse(text: str) -> list[Any]:
    parsed: list[Any] = parse(text, parsing_timeout=None)
    return parsed


def _verify(answer: str, references: tuple[str, ...]) -> RewardScore:
    predicted = _parse(answer)
    if not predicted:
        return RewardScore(value=0.0, code="no_answer")
    parsed_any = False
    for reference in references:
        gold = _parse(reference) or _parse(f"${reference}$")
        if not gold:
            continue
        parsed_any = True
        if verify(gold, predicted, timeout_seconds=None):
            return RewardScore(value=1.0)
    return RewardScore(value=0.0) if parsed_any else RewardScore(value=0.0, code="unparseable_reference")
