"""Held-out success of the sampling policy, and a paired comparison of two saved models by it.

    before = sampled_success(run_dir / "sft", 100, samples=4, temperature=1.0)     # per problem, in [0, 1]
    after = sampled_success(run_dir / "final", 100, samples=4, temperature=1.0)
    comparison = compare_rates(before, after)        # problems that improved, worsened; a sign test

RL maximizes the expected reward of the policy it samples from. So the measure of whether RL learned is that
expectation on problems it never trained on: each held-out problem answered `samples` times at the rollout
temperature, with the same seeds for both models, and per problem the success rate. A problem improved when the
second model's rate is higher, worsened when lower; the exact one-sided sign test over the changed problems says
how likely that many improvements would be by chance. Greedy success (`paired.py`) is the deployment figure; it
moves only where RL changes the argmax, which twenty steps often do not do on balance even when the policy got
better (measured in the agent-train README). This module knows model directories, the demo recipe and the
runtime; nothing about training.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import msgspec

from agent_train.local.paired import held_out_rows, sign_test_p

__all__ = ["RateComparison", "compare_rates", "sampled_success"]


class RateComparison(msgspec.Struct, frozen=True, kw_only=True):
    """Per-problem success rates of two models on the same problems and seeds, and what changed."""

    before: list[float]
    after: list[float]

    @property
    def improved(self) -> int:
        return sum(a > b for b, a in zip(self.before, self.after, strict=True))

    @property
    def worsened(self) -> int:
        return sum(a < b for b, a in zip(self.before, self.after, strict=True))

    @property
    def sign_test_p(self) -> float:
        return sign_test_p(self.improved, self.worsened)

    def summary(self) -> str:
        n = len(self.before)
        return (
            f"{n} problems: mean success {sum(self.before) / n:.3f} -> {sum(self.after) / n:.3f}; improved "
            f"{self.improved}, worsened {self.worsened}, sign test p = {self.sign_test_p:.2g}"
        )


def compare_rates(before: Sequence[float], after: Sequence[float]) -> RateComparison:
    if len(before) != len(after):
        raise ValueError(f"a paired comparison needs the same problems: {len(before)} rates vs {len(after)}")
    return RateComparison(before=[float(x) for x in before], after=[float(x) for x in after])


def sampled_success(
    model_dir: str | Path,
    size: int,
    *,
    samples: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    max_batch_size: int = 256,
) -> list[float]:
    """Each of the first `size` held-out problems answered `samples` times at `temperature` by a saved demo
    model (sample `j` of problem `i` with seed ``seed + 7919 * j + i``); the success rate per problem."""
    from agent_runtime import AgentRuntime
    from agent_runtime.engines import HFEngine
    from agent_train.local.lockstep import LockstepEngine
    from agent_train.local.rollout import ROLLOUT_BATCHING

    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    recipe, rows = held_out_rows(size)

    async def run() -> list[float]:
        engine = LockstepEngine(HFEngine.from_pretrained(model_dir, max_batch_size=max_batch_size, **ROLLOUT_BATCHING))
        try:
            base = msgspec.structs.replace(recipe.sampling, temperature=temperature, top_p=1.0)
            runtime = AgentRuntime(engine, recipe.make_session(engine.tokenizer), sampling=base)
            jobs = [
                runtime.run(
                    rows[i]["prompt"],
                    task={key: value for key, value in rows[i].items() if key != "prompt"},
                    sampling=msgspec.structs.replace(base, seed=seed + 7919 * j + i),
                )
                for i in range(size)
                for j in range(samples)
            ]
            results = await engine.gather(jobs)  # in lockstep: batches in episode order, not arrival order
        finally:
            await engine.close()
        rates = [0.0] * size
        for index, result in enumerate(results):
            rates[index // samples] += float(result.trajectory.reward >= 1.0) / samples
        return rates

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    """Compare two saved demo models by the success of their sampling policy on the same held-out problems and
    seeds: problems improved, worsened, sign test."""
    import argparse

    from agent_runtime import ignore_pynvml_deprecation
    from agent_train.demo.model import is_model_dir

    ignore_pynvml_deprecation()
    parser = argparse.ArgumentParser(prog="python -m agent_train.local.sampled", description=main.__doc__)
    parser.add_argument("before", help="a demo model directory (runs/demo/sft, ...)")
    parser.add_argument("after", help="another one (runs/demo/final, ...)")
    parser.add_argument("--size", type=int, default=100, help="held-out problems, the first N (default: 100)")
    parser.add_argument("--samples", type=int, default=4, help="answers per problem (default: 4)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    args = parser.parse_args(argv)
    for model_dir in (args.before, args.after):
        if not is_model_dir(model_dir):
            parser.error(f"{model_dir} is not a model directory (no config.json, model.safetensors, ...)")
    before, after = (
        sampled_success(model, args.size, samples=args.samples, temperature=args.temperature)
        for model in (args.before, args.after)
    )
    print(f"{args.before} -> {args.after}, {compare_rates(before, after).summary()}")
    return 0


if __name__ == "__main__":
    import logging
    import sys

    import structlog

    # the entry point (the library configures no logging): quiet the episodes' info lines around the one printed
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sys.exit(main())
