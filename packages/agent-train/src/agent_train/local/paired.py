"""Paired comparison of two saved models on the same held-out problems: which problems the second one fixed and
which it broke, and an exact sign test over the changed ones.

    comparison = compare(before, after)          # per-problem success, lists of bools in the same problem order
    comparison.fixed, comparison.broken          # before wrong & after right, before right & after wrong
    comparison.sign_test_p                       # one-sided: the chance of >= `fixed` if fixing were a coin flip

From a shell, for the SFT model and the final model of a run (greedy episodes, the engine batched as the trainer
batches its evaluations):

    uv run python -m agent_train.local.paired runs/demo/sft runs/demo/final [--size 200]

A paired count is what separates "RL helped" from "this run's aggregate figure came out a point higher": two
models' aggregate success rates on 100 problems differ by a few points by chance alone, while the same
problems answered by both show exactly what changed. This module knows model directories, the demo recipe and
`evaluate`; it knows nothing about training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from agent_runtime import Recipe

__all__ = ["PairedComparison", "compare", "held_out_rows", "held_out_success", "main", "sign_test_p"]


class PairedComparison(msgspec.Struct, frozen=True, kw_only=True):
    """Per-problem success of two models on the same problems, and what changed between them."""

    before: list[bool]
    after: list[bool]

    @property
    def fixed(self) -> int:
        return sum(not b and a for b, a in zip(self.before, self.after, strict=True))

    @property
    def broken(self) -> int:
        return sum(b and not a for b, a in zip(self.before, self.after, strict=True))

    @property
    def sign_test_p(self) -> float:
        return sign_test_p(self.fixed, self.broken)

    def summary(self) -> str:
        n = len(self.before)
        return (
            f"{n} problems: before {sum(self.before)}, after {sum(self.after)}; fixed {self.fixed}, broken "
            f"{self.broken}, net {self.fixed - self.broken:+d}, sign test p = {self.sign_test_p:.2g}"
        )


def compare(before: Sequence[bool], after: Sequence[bool]) -> PairedComparison:
    if len(before) != len(after):
        raise ValueError(f"a paired comparison needs the same problems: {len(before)} results vs {len(after)}")
    return PairedComparison(before=[bool(x) for x in before], after=[bool(x) for x in after])


def sign_test_p(fixed: int, broken: int) -> float:
    """Exact one-sided sign test: the chance of at least `fixed` of the `fixed + broken` changed problems going
    the second model's way if each change were as likely to be a break as a fix (1.0 when nothing changed)."""
    if fixed < 0 or broken < 0:
        raise ValueError(f"counts must be >= 0, got fixed={fixed}, broken={broken}")
    changed = fixed + broken
    return float(sum(math.comb(changed, k) for k in range(fixed, changed + 1)) / 2**changed)


def held_out_rows(size: int) -> tuple[Recipe, list[dict[str, Any]]]:
    """The demo recipe and its first `size` held-out problems (a ValueError past the split's end)."""
    from agent_demo import make_recipe

    recipe = make_recipe()
    rows = [dict(row) for row in recipe.rows("test")]
    if not 0 < size <= len(rows):
        raise ValueError(f"size must be between 1 and {len(rows)} (the held-out problems), got {size}")
    return recipe, rows[:size]


def held_out_success(model_dir: str | Path, size: int, *, max_batch_size: int = 256) -> list[bool]:
    """Greedy episodes of a saved demo model on the first `size` held-out problems: success per problem."""
    import asyncio

    from agent_runtime.engines import HFEngine
    from agent_train.local.evaluate import evaluate
    from agent_train.local.lockstep import LockstepEngine
    from agent_train.local.rollout import ROLLOUT_BATCHING

    recipe, rows = held_out_rows(size)

    async def run() -> list[bool]:
        engine = LockstepEngine(HFEngine.from_pretrained(model_dir, max_batch_size=max_batch_size, **ROLLOUT_BATCHING))
        try:
            _, trajectories = await evaluate(engine, recipe, rows)
        finally:
            await engine.close()
        return [t.reward >= 1.0 for t in trajectories]

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    """Compare two saved demo models on the same held-out problems: fixed, broken, sign test."""
    import argparse

    from agent_runtime import ignore_pynvml_deprecation
    from agent_train.demo.model import is_model_dir

    ignore_pynvml_deprecation()
    parser = argparse.ArgumentParser(prog="python -m agent_train.local.paired", description=main.__doc__)
    parser.add_argument("before", help="a demo model directory (runs/demo/sft, ...)")
    parser.add_argument("after", help="another one (runs/demo/final, ...)")
    parser.add_argument("--size", type=int, default=200, help="held-out problems, the first N (default: 200)")
    args = parser.parse_args(argv)
    for model_dir in (args.before, args.after):
        if not is_model_dir(model_dir):
            parser.error(f"{model_dir} is not a model directory (no config.json, model.safetensors, ...)")
    comparison = compare(held_out_success(args.before, args.size), held_out_success(args.after, args.size))
    print(f"{args.before} -> {args.after}, {comparison.summary()}")
    return 0


if __name__ == "__main__":
    import logging
    import sys

    import structlog

    # the entry point (the library configures no logging): quiet the episodes' info lines around the one printed
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sys.exit(main())
