"""`MatchingReward`: compare the extracted final answer with the references as text.

Modes (`mode`):

- ``exact``: 1.0 when the extracted answer equals a reference after stripping whitespace;
- ``normalized``: 1.0 when they are equal after `normalize_answer` (case, punctuation, articles, spaces);
- ``contains``: 1.0 when a normalized reference occurs in the normalized answer (as whole words);
- ``f1``: the best token F1 against any reference (0.0-1.0).

The score is the best over all references. An episode without references scores 0.0 with code
``no_reference``; an answer from which nothing can be extracted scores 0.0 with code ``no_answer``.

This module knows text comparison; it knows nothing about engines or environments.
"""

from __future__ import annotations

from typing import Literal

from agent_env.reward import EpisodeRecord, ResultRewardStrategy, RewardScore
from agent_env.rewards.answer import ExtractMethod, extract_answer, normalize_answer, token_f1

__all__ = ["MatchMode", "MatchingReward"]

MatchMode = Literal["exact", "normalized", "contains", "f1"]


class MatchingReward(ResultRewardStrategy):
    """Text match of the final answer against the references. See the module docstring."""

    name = "matching"

    def __init__(
        self, *, mode: MatchMode = "normalized", extract: ExtractMethod = "auto", name: str | None = None
    ) -> None:
        if mode not in ("exact", "normalized", "contains", "f1"):
            raise ValueError(f"mode must be exact, normalized, contains or f1, got {mode!r}")
        self.mode: MatchMode = mode
        self.extract: ExtractMethod = extract
        if name:
            self.name = name

    async def score(self, episode: EpisodeRecord) -> RewardScore:
        if not episode.references:
            return RewardScore(value=0.0, code="no_reference")
        answer = extract_answer(episode.answer, self.extract)
        if answer is None:
            return RewardScore(value=0.0, code="no_answer")
        return RewardScore(value=max(self.compare(answer, reference) for reference in episode.references))

    def compare(self, answer: str, reference: str) -> float:
        """The score of one extracted answer against one reference."""
        if self.mode == "exact":
            return float(answer.strip() == reference.strip())
        if self.mode == "f1":
            return token_f1(answer, reference)
        normalized_answer, normalized_reference = normalize_answer(answer), normalize_answer(reference)
        if self.mode == "normalized":
            return float(normalized_answer == normalized_reference)
        if not normalized_reference:
            return 0.0
        return float(f" {normalized_reference} " in f" {normalized_answer} ")
