"""How `HFEngine` draws a token: each request's own `torch.Generator` (seeded with `SamplingParams.seed`, or
randomly; None below a temperature of 1e-5, which is greedy as in vLLM), and one draw for every sampled row of a
decode step: temperature, then top-k, then top-p, then `torch.multinomial`'s own draw for one sample.

This module knows sampling settings and torch; nothing about models, caches or batches.
"""

from __future__ import annotations

import torch

from agent_runtime.engines.base import SamplingParams

__all__ = ["GREEDY_BELOW", "filter_scores", "request_generator", "sample_rows"]

GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature this small means greedy


def request_generator(sampling: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A request's own generator on `device`, seeded with `sampling.seed` (randomly without one); None: greedy."""
    if sampling.temperature < GREEDY_BELOW:
        return None
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def sample_rows(
    logits: torch.Tensor, samplings: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token per row of raw logits, each row with its own settings and seeded generator: temperature ->
    top-k -> top-p, then a draw. The draw is `torch.multinomial`'s own for one sample (each row's probabilities
    over exponential noise from its generator, arg max), done for all rows at once: the same tokens as a
    `multinomial` call per row (`tests/agent_runtime/test_engine_hf_sampling.py`), with one call per row fewer."""
    temperatures = torch.tensor([s.temperature for s in samplings], dtype=logits.dtype, device=logits.device)
    scores = logits / temperatures.unsqueeze(1)
    for row, sampling in enumerate(samplings):
        if 0 < sampling.top_k < scores.shape[1] or sampling.top_p < 1.0:
            scores[row] = filter_scores(scores[row], sampling)
    probs = torch.softmax(scores, dim=-1)
    noise = torch.empty_like(probs)
    for row, generator in enumerate(generators):
        noise[row].exponential_(1, generator=generator)
    return [int(t) for t in (probs / noise).argmax(-1).tolist()]


def filter_scores(scores: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """One row's tempered scores with top-k and top-p applied (the tokens left out at -inf)."""
    if 0 < sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it already does
        drop = (probs.cumsum(-1) - probs) >= sampling.top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(0, order, sorted_scores)
    return scores
