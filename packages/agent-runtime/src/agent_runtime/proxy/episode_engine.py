"""`EpisodeEngine`: the rollout engine as one agent program's endpoint uses it.

Two things differ from serving. The sampling is the rollout's, not the client's: a program may send any
`temperature` or `seed`, but the trained policy must be sampled as the trainer asks (its temperature, its seed, its
logprobs), so only the per-turn token cap and the stop tokens of a request are kept. And the episode has a token
budget: the tokens generated over all of its requests; each request may generate at most what is left, and one
that finds nothing left fails with `EngineError` (the client sees a 500 ``engine_error``), setting `exhausted`.

This module knows engines and sampling only.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from agent_runtime.engines.base import Generation, LLMEngine, SamplingParams
from agent_runtime.errors import EngineError

__all__ = ["EpisodeEngine"]


class EpisodeEngine(LLMEngine):
    """`engine` with the episode's `sampling` and token budget (`max_tokens`; None: unbounded). Images pass
    through to `engine`, which takes them when it `accepts_images`."""

    def __init__(self, engine: LLMEngine, sampling: SamplingParams, *, max_tokens: int | None = None) -> None:
        self.engine = engine
        self.name = engine.name
        self.tokenizer = engine.tokenizer
        self.context_length = engine.context_length
        self.stop_token_ids = engine.stop_token_ids
        self.accepts_images = engine.accepts_images
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.generated = 0
        self.calls = 0
        self.exhausted = False

    @property
    def policy_version(self) -> int | None:  # type: ignore[override]  # the engine's, as it moves
        return self.engine.policy_version

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        self.calls += 1
        wanted = sampling.max_new_tokens
        if self.max_tokens is not None:
            left = self.max_tokens - self.generated
            if left <= 0:
                self.exhausted = True
                raise EngineError(f"the episode's token budget of {self.max_tokens} generated tokens is spent")
            wanted = min(wanted, left)
        stops = tuple(dict.fromkeys([*self.sampling.stop_token_ids, *sampling.stop_token_ids]))
        params = msgspec.structs.replace(self.sampling, max_new_tokens=wanted, stop_token_ids=stops)
        if images:
            generation = await self.engine.generate(prompt_ids, params, images=images)
        else:
            generation = await self.engine.generate(prompt_ids, params)
        self.generated += len(generation.ids)
        return generation
