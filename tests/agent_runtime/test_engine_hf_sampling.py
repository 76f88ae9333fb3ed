"""The hf engine draws a batch's sampled tokens at once (`hf_sampling.sample_rows`): the same tokens as one
`torch.multinomial` per row with that row's seeded generator, for every mix of temperature, top-k and top-p in one
batch; so a seed still reproduces its sample, alone or batched with others."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from agent_runtime import SamplingParams  # noqa: E402
from agent_runtime.engines.hf_sampling import filter_scores, request_generator, sample_rows  # noqa: E402

CPU = torch.device("cpu")


def per_row(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> int:
    """The reference: temper, filter, softmax, and one `torch.multinomial` draw."""
    probs = torch.softmax(filter_scores(logits / sampling.temperature, sampling), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


SETTINGS = [
    SamplingParams(temperature=1.0, top_p=1.0),
    SamplingParams(temperature=0.7, top_p=1.0),
    SamplingParams(temperature=1.3, top_p=0.9),
    SamplingParams(temperature=1.0, top_p=1.0, top_k=5),
    SamplingParams(temperature=0.5, top_p=0.8, top_k=50),
]


@pytest.mark.parametrize("vocab", [1024, 151_669])
def test_a_batch_draws_what_a_multinomial_per_row_draws(vocab: int) -> None:
    torch.manual_seed(0)
    rows = 24 if vocab > 10_000 else 96
    logits = torch.randn(rows, vocab) * 3
    samplings = [
        SamplingParams(
            temperature=SETTINGS[row % len(SETTINGS)].temperature,
            top_p=SETTINGS[row % len(SETTINGS)].top_p,
            top_k=SETTINGS[row % len(SETTINGS)].top_k,
            seed=1000 + row,
        )
        for row in range(rows)
    ]
    for _ in range(3):  # three decode steps: each generator moves on by one draw per step
        batched = [request_generator(s, CPU) for s in samplings]
        alone = [request_generator(s, CPU) for s in samplings]
        for step in range(3):
            step_logits = logits.roll(step, dims=1)
            expected = [per_row(step_logits[row], samplings[row], alone[row]) for row in range(rows)]
            assert sample_rows(step_logits, samplings, batched) == expected
        logits = logits.flip(0)


def test_a_seed_reproduces_its_draw_whatever_else_is_in_the_batch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(8, 512)
    mine = SamplingParams(temperature=1.0, top_p=1.0, seed=7)
    others = [SamplingParams(temperature=1.0, top_p=1.0, seed=s) for s in range(7)]
    alone = sample_rows(logits[:1], [mine], [request_generator(mine, CPU)])
    batched = sample_rows(logits, [mine, *others], [request_generator(s, CPU) for s in [mine, *others]])
    assert batched[0] == alone[0]
