"""VLLMEngine: import-guarded (importing it never imports vllm), a clear error where vllm is missing, and on a
CUDA machine with vllm, greedy ids that match HFEngine token for token (marked `gpu`, skipped elsewhere)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runtime.engines import make_engine
from agent_runtime.engines.base import SamplingParams
from agent_runtime.engines.vllm import VLLMEngine, vllm_available
from agent_runtime.errors import EngineUnavailable


def test_importing_the_engine_modules_imports_no_backend() -> None:
    code = (
        "import sys, json\n"
        "import agent_runtime.engines, agent_runtime.engines.vllm, agent_runtime.engines.registry\n"
        "print(json.dumps([m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_without_vllm_the_engine_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # how Python spells "not installed": import vllm now fails
    assert not vllm_available()
    with pytest.raises(EngineUnavailable, match=r"vllm package is not installed; install agent-runtime\[vllm\]"):
        VLLMEngine(tmp_path)
    with pytest.raises(EngineUnavailable, match=r"agent-runtime\[vllm\]"):
        make_engine("vllm", model=str(tmp_path))


def _cuda_and_vllm() -> bool:
    if not vllm_available():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_and_vllm(), reason="needs a CUDA GPU and vllm")
def test_vllm_greedy_matches_hf_token_for_token(tiny_qwen3_dir: Path) -> None:
    from agent_runtime.engines.hf import HFEngine

    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)

    async def both() -> None:
        vllm_engine = VLLMEngine(
            tiny_qwen3_dir, dtype="float32", context_length=2048, gpu_memory_utilization=0.2, enforce_eager=True
        )
        hf_engine = HFEngine.from_pretrained(tiny_qwen3_dir, device="cuda", dtype="float32")
        try:
            assert vllm_engine.stop_token_ids == hf_engine.stop_token_ids == (151645, 151643)
            prompts = [
                hf_engine.tokenize(t) for t in ("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "hi")
            ]
            for prompt in prompts:
                ours, theirs = await hf_engine.generate(prompt, greedy), await vllm_engine.generate(prompt, greedy)
                assert theirs.ids == ours.ids
                assert theirs.text == ours.text
                assert theirs.logprobs == pytest.approx(ours.logprobs, abs=1e-2)
        finally:
            await vllm_engine.close()
            await hf_engine.close()

    asyncio.run(both())
