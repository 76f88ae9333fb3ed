"""How long does an `HFEngine` turn take at N tokens of history? This tree's engine side by side with a baseline
commit's, on the tests' tiny random-weight Qwen3 (CPU, float32) unless said otherwise, interleaved in one run.

- Turn at N tokens of history: one episode's previous turn (a prompt of about N tokens, greedy) is generated
  untimed; the timed turn's prompt is that prompt + its generated ids + a tool response's feedback ids, as the
  runtime sends it (token-in, token-out). `--new-tokens` greedy ids, logprobs asked (the runtime's default). The
  engine under test starts each repeat with an empty prefix cache, so what it reuses is the previous turn only.
- Batch of 8 turns: the same for 8 episodes whose timed turns arrive together (one batch).
- 8 turns arriving apart: 8 episodes' turns (about 200-id openings) sent `--gap-ms` apart, as turns come back from
  their tools at different times; reported: the mean time from a turn's send to its answer. This tree's engine
  takes a turn that arrives while a batch runs into that batch; the baseline's waits for the batch to end.
- 64 episodes x 4 turns on a model of the calculator demo's shape (vocabulary 1024, so a decode step is cheap
  and the prefill weighs more), all started at once with the local trainer's batching (up to 256 rows, 50 ms
  wait): a rollout as `apps/train` runs it, without the environment.
- Reject a bad 32k prompt: `generate` on 32,000 ids whose last id is outside the vocabulary, which both engines
  refuse before the model runs: the cost of checking a prompt's ids (median of 20 calls).

Each engine has its own model object with the same weights (this tree's engine switches a grouped-query model's
attention to `hf_attention.GQA_SDPA`, which the baseline's must not inherit; until that change both engines shared
one object). The baseline's `engines/hf.py` is read from a temporary
git worktree of `--baseline` (default ee63069, main before issue 17) and imported by path; the rest of the
package is this tree's (the engine's imports, `engines/base.py` and `errors.py`, did not change in between).
Each repeat runs both sides, in alternating order; reported: min and median per side, and baseline / this tree
(above 1: this tree is faster). Every timed turn's ids must be equal on both sides, or the script fails.

    uv run python bench/bench_hf_engine.py [--baseline ee63069] [--histories 1000 3000] [--new-tokens 32]
        [--repeats 5] [--gap-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

ROOT = Path(__file__).resolve().parents[1]
ENGINE = Path("packages/agent-runtime/src/agent_runtime/engines/hf.py")
DEFAULT_BASELINE = "ee63069"
WORDS = ["the", "model", "reads", "a", "passage", "about", "tokenizers", "rollouts", "rewards", "engines", "budget"]
FEEDBACK = "<|im_end|>\n<|im_start|>user\n<tool_response>\n413\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
CHECK_REPEATS = 20


def baseline_module(ref: str) -> ModuleType:
    """The baseline commit's `engines/hf.py`, imported by path from a temporary worktree (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True)
        try:
            spec = importlib.util.spec_from_file_location("baseline_hf_engine", tree / ENGINE)
            if spec is None or spec.loader is None:
                raise RuntimeError(f"cannot import {tree / ENGINE}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # its dataclasses look their module up there
            spec.loader.exec_module(module)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    return module


def tiny_model_dir() -> Any:
    """The tests' tiny random-weight Qwen3 (built on first use, with the real Qwen3 tokenizer): what the hf benches
    run on. Logs at INFO."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    sys.path.insert(0, str(ROOT))
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path
    from tests.support.tiny_qwen3 import tiny_qwen3_path

    return tiny_qwen3_path(qwen3_tokenizer_path())


def tiny_engine() -> Any:
    """This tree's `HFEngine` on `tiny_model_dir()`, CPU, float32."""
    model_dir = tiny_model_dir()
    from agent_runtime.engines.hf import HFEngine

    return HFEngine.from_pretrained(model_dir, device="cpu", dtype="float32")


def opening(engine: Any, tokens: int, seed: int) -> list[int]:
    """A user message of about `tokens` ids in Qwen3's chat format (a different word order for each seed)."""
    head = engine.tokenize("<|im_start|>user\n")
    tail = engine.tokenize("<|im_end|>\n<|im_start|>assistant\n")
    words = " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(tokens))
    return head + engine.tokenize(words)[: tokens - len(head) - len(tail)] + tail


def prepare(engine: Any, openings: Sequence[list[int]], sampling: Any) -> list[list[int]]:
    """Run every episode's previous turn (untimed) and return the timed turns' prompts."""
    from agent_runtime import SamplingParams

    before = SamplingParams(max_new_tokens=sampling.max_new_tokens, temperature=0.0)

    async def previous() -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(p, before) for p in openings)))

    feedback = engine.tokenize(FEEDBACK)
    return [p + g.ids + feedback for p, g in zip(openings, asyncio.run(previous()), strict=True)]


def timed_turns(engine: Any, openings: Sequence[list[int]], sampling: Any) -> tuple[float, list[list[int]]]:
    if hasattr(engine, "clear_prefix_cache"):
        engine.clear_prefix_cache()
    prompts = prepare(engine, openings, sampling)

    async def turns() -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(p, sampling) for p in prompts)))

    started = time.perf_counter()
    generations = asyncio.run(turns())
    return time.perf_counter() - started, [g.ids for g in generations]


async def sent_after(engine: Any, prompt: list[int], sampling: Any, delay_s: float) -> tuple[float, list[int]]:
    """Send `prompt` after `delay_s`: the seconds from the send to the answer, and its ids."""
    await asyncio.sleep(delay_s)
    started = time.perf_counter()
    generation = await engine.generate(prompt, sampling)
    return time.perf_counter() - started, generation.ids


def staggered_turns(
    engine: Any, prompts: Sequence[list[int]], sampling: Any, gap_s: float
) -> tuple[float, list[list[int]]]:
    """Send `prompts` one every `gap_s` seconds; the mean time from a send to its answer, and the ids."""
    if hasattr(engine, "clear_prefix_cache"):
        engine.clear_prefix_cache()

    async def all_turns() -> list[tuple[float, list[int]]]:
        return list(await asyncio.gather(*(sent_after(engine, p, sampling, i * gap_s) for i, p in enumerate(prompts))))

    answers = asyncio.run(all_turns())
    return statistics.mean(seconds for seconds, _ in answers), [ids for _, ids in answers]


def reject_time(engine: Any, bad_prompt: list[int], sampling: Any) -> float:
    async def once() -> float:
        started = time.perf_counter()
        try:
            await engine.generate(bad_prompt, sampling)
        except ValueError:
            return time.perf_counter() - started
        raise RuntimeError("the engine accepted an out-of-vocabulary id")

    return statistics.median(asyncio.run(once()) for _ in range(CHECK_REPEATS))


def demo_shaped_model() -> Any:
    """A random Qwen3 of the calculator demo's shape (`DemoModelSpec`: vocab 1024, width 192, 4 layers), whose
    small vocabulary makes a decode step cheap, so the prefill is a larger share of a turn than on the tiny
    Qwen3. initializer_range 0.3 (the tiny Qwen3's) keeps greedy free of near-ties."""
    import torch
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=1024, hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, initializer_range=0.3,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(config).eval()


async def rollout(engine: Any, episodes: int, turns: int, sampling: Any) -> list[list[int]]:
    """`episodes` concurrent token-in-token-out episodes of `turns` turns (a 200-id opening, 20 feedback ids)."""

    async def episode(index: int) -> list[int]:
        prompt = [(index * 37 + i * 11) % 1000 + 1 for i in range(200)]
        for turn in range(turns):
            generation = await engine.generate(prompt, sampling)
            prompt = prompt + generation.ids + [(turn * 13 + i) % 1000 + 1 for i in range(20)]
        return prompt

    return list(await asyncio.gather(*(episode(i) for i in range(episodes))))


class SameIds:
    """The ids of every timed case, per side: each side must give the same ids on every repeat (`record`), and the
    two sides each other's (`check`), or the run is not a fair comparison and the script fails."""

    def __init__(self) -> None:
        self.outputs: dict[str, dict[str, list[list[int]]]] = {}

    def record(self, name: str, side: str, ids: list[list[int]]) -> None:
        if self.outputs.setdefault(name, {}).setdefault(side, ids) != ids:
            raise RuntimeError(f"{name}: {side} gave different ids on a repeat")

    def check(self, one: str, other: str) -> None:
        for name, by_side in self.outputs.items():
            if by_side[one] != by_side[other]:
                raise RuntimeError(f"{name}: the ids of {one} and {other} differ")


def timed_rollout(engine: Any, sampling: Any) -> tuple[float, list[list[int]]]:
    """`rollout` of 64 episodes x 4 turns from an empty prefix cache: its seconds and ids."""
    if hasattr(engine, "clear_prefix_cache"):
        engine.clear_prefix_cache()
    started = time.perf_counter()
    ids = asyncio.run(rollout(engine, 64, 4, sampling))
    return time.perf_counter() - started, ids


def interleaved(
    cases: dict[str, Callable[[str], float]], sides: list[str], repeats: int
) -> dict[str, dict[str, list[float]]]:
    """Each case's seconds per side over `repeats` rounds, the sides alternating which goes first."""
    times: dict[str, dict[str, list[float]]] = {name: {side: [] for side in sides} for name in cases}
    for repeat in range(repeats):
        order = sides if repeat % 2 == 0 else list(reversed(sides))
        for name, case in cases.items():
            for side in order:
                times[name][side].append(case(side))
        print(f"repeat {repeat + 1}/{repeats} done", file=sys.stderr)
    return times


def print_table(times: dict[str, dict[str, list[float]]], old: str, new: str) -> None:
    """A markdown table: min / median of each side, and old / new (above 1: `new` is faster)."""
    print(f"| case | {old} min / median | {new} min / median | {old} / {new} (min, median) |")
    print("|---|---:|---:|---:|")
    for name, by_side in times.items():
        a, b = by_side[old], by_side[new]
        print(
            f"| {name} | {min(a) * 1e3:.1f} / {statistics.median(a) * 1e3:.1f} ms "
            f"| {min(b) * 1e3:.1f} / {statistics.median(b) * 1e3:.1f} ms "
            f"| {min(a) / min(b):.2f}x, {statistics.median(a) / statistics.median(b):.2f}x |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="the commit whose engines/hf.py is the baseline")
    parser.add_argument("--histories", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gap-ms", type=float, default=10.0, help="between the arrivals of the staggered turns")
    args = parser.parse_args(argv)

    model_dir = tiny_model_dir()
    from agent_runtime import SamplingParams
    from agent_runtime.engines.hf import HFEngine

    baseline_class = baseline_module(args.baseline).HFEngine
    import torch
    import transformers

    # Each side gets its own model object: this tree's engine switches a grouped-query model's attention
    # (`hf_attention`), which the baseline's engine must not inherit through a shared model.
    subject = tiny_engine()
    baseline_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engines = {"baseline": baseline_class(baseline_model, subject.tokenizer), "this tree": subject}
    demo_model, demo_baseline_model = demo_shaped_model(), demo_shaped_model()  # seeded: the same weights
    demo_options: dict[str, Any] = {"max_batch_size": 256, "batch_wait_s": 0.05}  # the local trainer's
    demo_engines = {
        "baseline": baseline_class(demo_baseline_model, subject.tokenizer, **demo_options),
        # the trainer's own engine joins turns at once (`agent_train.local.rollout.ROLLOUT_BATCHING`)
        "this tree": HFEngine(demo_model, subject.tokenizer, join_ratio=0, join_wait_steps=0, **demo_options),
    }
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)

    cases: dict[str, Callable[[str], float]] = {}
    same = SameIds()

    def turn_case(name: str, openings: list[list[int]]) -> None:
        def case(side: str) -> float:
            seconds, ids = timed_turns(engines[side], openings, sampling)
            same.record(name, side, ids)
            return seconds

        cases[name] = case

    def rollout_case(side: str) -> float:
        seconds, ids = timed_rollout(demo_engines[side], sampling)
        same.record("rollout", side, ids)
        return seconds

    for history in args.histories:
        turn_case(f"turn at {history} tokens of history", [opening(subject, history, 0)])
    turn_case("batch of 8 turns at 1000 tokens", [opening(subject, 1000, seed) for seed in range(8)])
    staggered = [opening(subject, 200, seed) for seed in range(8)]

    def staggered_case(side: str) -> float:
        seconds, ids = staggered_turns(engines[side], staggered, sampling, args.gap_ms / 1e3)
        same.record("staggered", side, ids)
        return seconds

    cases[f"8 turns arriving {args.gap_ms:g} ms apart (mean latency)"] = staggered_case
    cases["64 episodes x 4 turns, demo-shaped model"] = rollout_case
    bad = [*(opening(subject, 1000, 0) * 32)[:31_999], subject.vocab_size]
    cases["reject a bad 32k prompt"] = lambda side: reject_time(engines[side], bad, sampling)

    times = interleaved(cases, list(engines), args.repeats)
    same.check("baseline", "this tree")

    print(f"CPU float32, {args.new_tokens} new greedy tokens per turn (logprobs asked), {args.repeats} repeats")
    print(f"interleaved; baseline: {args.baseline} engines/hf.py; ids equal on both sides for every timed case\n")
    print_table(times, "baseline", "this tree")
    for engine in [*engines.values(), *demo_engines.values()]:
        asyncio.run(engine.close())


if __name__ == "__main__":
    main()
