"""VLLMEngine: import-guarded (importing it never imports vllm), a clear error where vllm is missing, the vLLM
requests it builds (on CPU, with vLLM's own classes and an honest stand-in for the GPU part), and on a CUDA
machine with vllm, greedy ids that match HFEngine token for token (marked `gpu`, skipped elsewhere).

The CPU tests import vllm once per module (about 45 s on a loaded 2-core machine, a few seconds elsewhere) and
build everything vLLM's API takes (`AsyncEngineArgs`, `SamplingParams`, `TokensPrompt`) through the engine's own
code. Only `AsyncLLM`, which needs a GPU, is replaced by `ReplayingAsyncLLM`: it records what it receives and
answers with real Qwen3 token ids in vLLM's own `RequestOutput` / `CompletionOutput` / logprob containers,
applying the stop ids, `max_tokens`, `logprobs` and `output_kind` of the `SamplingParams` it was given, as vLLM
does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from agent_protocol import HFTokenizer
from agent_runtime.engines import make_engine
from agent_runtime.engines import vllm as vllm_engine_module
from agent_runtime.engines.base import Generation, SamplingParams
from agent_runtime.engines.vllm import VLLMEngine, vllm_available
from agent_runtime.errors import ContextBudgetExceeded, EngineBadOutput, EngineError, EngineUnavailable


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


# -- vLLM's request objects, built on CPU -----------------------------------------------------------------------

REPLY = "The answer is 4.<|im_end|>"  # what the stand-in "samples": real ids of the real tokenizer
REPLY_LOGPROB = -0.5


@pytest.fixture(scope="module")
def vllm_api() -> dict[str, Any]:
    """vLLM's classes, imported once for the module by the engine's own importer."""
    if not vllm_available():
        pytest.skip("vllm is not installed")
    return vllm_engine_module._import_vllm()


class ReplayingAsyncLLM:
    """Stands in for vLLM's `AsyncLLM` (the part that needs a GPU): records the engine args, prompts, sampling
    params and request ids it receives and answers each request with `reply` (token ids), cut at the first stop
    id or at `max_tokens` as vLLM cuts it, in vLLM's own output classes."""

    reply: ClassVar[list[int]] = []
    finish_override: ClassVar[str | None] = None  # e.g. "error": what vLLM reports for a failed request
    raise_on_generate: ClassVar[BaseException | None] = None
    instances: ClassVar[list[ReplayingAsyncLLM]] = []

    def __init__(self, args: Any) -> None:
        self.args = args
        self.model_config = SimpleNamespace(max_model_len=args.max_model_len or 2048, hf_config=SimpleNamespace())
        self.tokenizer = None
        self.received: list[tuple[Any, Any, str]] = []
        self.shut_down = False

    @classmethod
    def from_engine_args(cls, args: Any) -> ReplayingAsyncLLM:
        engine = cls(args)
        cls.instances.append(engine)
        return engine

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import RequestOutputKind

        self.received.append((prompt, params, request_id))
        if self.raise_on_generate is not None:
            raise self.raise_on_generate
        stops = set(params.stop_token_ids or ())
        ids: list[int] = []
        finish, stop_reason = "length", None
        for token in self.reply[: params.max_tokens]:
            ids.append(token)
            if token in stops:
                finish, stop_reason = "stop", token
                break
        logprobs = None
        if params.logprobs is not None:
            logprobs = create_sample_logprobs(params.flat_logprobs)
            for token in ids:  # the sampled token, then the top-`logprobs` (here the same token)
                append_logprobs_for_next_position(
                    logprobs, [token, token], [REPLY_LOGPROB] * 2, [None, None], 1, params.logprobs
                )

        def output(upto: int, start: int = 0, final: bool = True) -> Any:
            done = final and upto == len(ids)
            completion = CompletionOutput(
                index=0,
                text="",  # detokenize=False: vLLM leaves the text empty
                token_ids=ids[start:upto],
                cumulative_logprob=None,
                logprobs=None if logprobs is None else logprobs[start:upto],
                finish_reason=(self.finish_override or finish) if done else None,
                stop_reason=stop_reason if done else None,
            )
            return RequestOutput(
                request_id=request_id,
                prompt=None,
                prompt_token_ids=list(prompt["prompt_token_ids"]),
                prompt_logprobs=None,
                outputs=[completion],
                finished=done,
            )

        if params.output_kind == RequestOutputKind.FINAL_ONLY:
            yield output(len(ids))
        else:
            delta = params.output_kind == RequestOutputKind.DELTA
            for upto in range(1, len(ids) + 1):
                await asyncio.sleep(0)
                yield output(upto, start=upto - 1 if delta else 0)

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3_dir: Path) -> HFTokenizer:
    return HFTokenizer.from_file(tiny_qwen3_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def reply_ids(qwen3: HFTokenizer) -> list[int]:
    return qwen3.encode(REPLY)


@pytest.fixture
def replaying(
    vllm_api: dict[str, Any], reply_ids: list[int], monkeypatch: pytest.MonkeyPatch
) -> Iterator[type[ReplayingAsyncLLM]]:
    """The engine's importer, with `AsyncLLM` replaced by a fresh `ReplayingAsyncLLM` class."""
    stand_in = type("ReplayingAsyncLLM", (ReplayingAsyncLLM,), {"reply": list(reply_ids), "instances": []})
    monkeypatch.setattr(vllm_engine_module, "_import_vllm", lambda: {**vllm_api, "AsyncLLM": stand_in})
    yield stand_in


def _generate(engine: VLLMEngine, prompt: Sequence[int], sampling: SamplingParams) -> Generation:
    return asyncio.run(engine.generate(prompt, sampling))


def test_engine_args_are_real_vllm_args(
    replaying: type[ReplayingAsyncLLM], vllm_api: dict[str, Any], tiny_qwen3_dir: Path
) -> None:
    engine = VLLMEngine(
        tiny_qwen3_dir,
        context_length=64,
        dtype="float32",
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        seed=3,
        engine_args={"tensor_parallel_size": 1, "max_num_seqs": 8},
    )
    (llm,) = replaying.instances
    args = llm.args
    assert isinstance(args, vllm_api["AsyncEngineArgs"])
    assert args.model == str(tiny_qwen3_dir) and args.max_model_len == 64 and args.dtype == "float32"
    assert args.gpu_memory_utilization == 0.3 and args.enforce_eager is True and args.seed == 3
    assert args.logprobs_mode == "raw_logprobs"  # before temperature/top-k/top-p, as training needs
    assert args.disable_log_stats is True and args.tensor_parallel_size == 1 and args.max_num_seqs == 8
    assert engine.context_length == 64
    assert engine.stop_token_ids == (151645, 151643)  # generation_config.json's eos ids, read by transformers
    assert isinstance(engine.tokenizer, HFTokenizer)  # the model directory's tokenizer.json
    asyncio.run(engine.close())
    assert llm.shut_down


def test_sampled_request_carries_every_setting(
    qwen3: HFTokenizer, replaying: type[ReplayingAsyncLLM], vllm_api: dict[str, Any], tiny_qwen3_dir: Path
) -> None:
    engine = VLLMEngine(tiny_qwen3_dir, tokenizer=qwen3, context_length=64)
    period = engine.tokenize(".")[0]
    sampling = SamplingParams(
        max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=20, seed=11, stop_token_ids=(period,)
    )
    prompt = engine.tokenize("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    generation = _generate(engine, prompt, sampling)
    ((sent_prompt, params, request_id),) = replaying.instances[0].received
    assert sent_prompt == {"prompt_token_ids": prompt}  # a TokensPrompt: ids in, never text
    assert all(type(i) is int for i in sent_prompt["prompt_token_ids"])
    assert isinstance(params, vllm_api["SamplingParams"])
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed) == (12, 0.7, 0.9, 20, 11)
    assert params.stop_token_ids == sorted({151643, 151645, period})
    assert params.logprobs == 1 and params.detokenize is False and params.skip_special_tokens is False
    assert params.output_kind == vllm_api["RequestOutputKind"].FINAL_ONLY
    assert len(request_id) == 32 and int(request_id, 16) >= 0
    reply = engine.tokenize(REPLY)
    expected = reply[: reply.index(period) + 1]  # vLLM keeps the stop token in the ids
    assert generation == Generation(
        ids=expected,
        text="The answer is 4.",
        logprobs=[REPLY_LOGPROB] * len(expected),
        finish_reason="stop",
        exact_text=True,  # decoded from the ids by the engine's tokenizer
    )


def test_greedy_request_is_clamped_to_the_context_and_asks_no_logprobs(
    qwen3: HFTokenizer, replaying: type[ReplayingAsyncLLM], vllm_api: dict[str, Any], tiny_qwen3_dir: Path
) -> None:
    engine = VLLMEngine(tiny_qwen3_dir, tokenizer=qwen3, context_length=64)
    prompt = list(range(100, 160))  # 60 ids: room for 4 more in a 64-token context
    generation = _generate(engine, prompt, SamplingParams(max_new_tokens=10, temperature=0.0, logprobs=False))
    ((_, params, _),) = replaying.instances[0].received
    assert params.max_tokens == 4
    assert (params.temperature, params.top_k, params.top_p, params.seed) == (0.0, 0, 1.0, None)  # vLLM's greedy
    assert params.logprobs is None
    assert generation.ids == engine.tokenize(REPLY)[:4]
    assert (generation.logprobs, generation.finish_reason) == (None, "length")
    with pytest.raises(ContextBudgetExceeded):
        _generate(engine, list(range(100, 164)), SamplingParams())
    assert len(replaying.instances[0].received) == 1  # the overlong prompt never reached vLLM


def test_two_requests_get_distinct_ids(
    qwen3: HFTokenizer, replaying: type[ReplayingAsyncLLM], tiny_qwen3_dir: Path
) -> None:
    engine = VLLMEngine(tiny_qwen3_dir, tokenizer=qwen3, context_length=64)

    async def both() -> None:
        await asyncio.gather(*(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=3)) for _ in range(2)))

    asyncio.run(both())
    first, second = (request_id for _, _, request_id in replaying.instances[0].received)
    assert first != second  # vLLM refuses a request id that is already running


def test_a_failed_request_is_an_engine_error_not_an_aborted_generation(
    qwen3: HFTokenizer, replaying: type[ReplayingAsyncLLM], tiny_qwen3_dir: Path
) -> None:
    """vLLM reports a request that failed inside the engine (a KV-cache load, say) as `finish_reason="error"`;
    its own server answers 500. Its partial ids must not reach a transcript as an `abort`."""
    engine = VLLMEngine(tiny_qwen3_dir, tokenizer=qwen3, context_length=64)
    replaying.finish_override = "error"
    with pytest.raises(EngineError, match="internal error") as info:
        _generate(engine, [1, 2, 3], SamplingParams(max_new_tokens=8))
    assert info.value.code == "engine_error"
    replaying.finish_override = "repetition"  # a reason this engine never asks for: not silently an abort
    with pytest.raises(EngineBadOutput, match="unknown finish reason 'repetition'"):
        _generate(engine, [1, 2, 3], SamplingParams(max_new_tokens=8))


def test_ids_outside_the_tokenizer_are_bad_output(
    qwen3: HFTokenizer, replaying: type[ReplayingAsyncLLM], tiny_qwen3_dir: Path
) -> None:
    engine = VLLMEngine(tiny_qwen3_dir, tokenizer=qwen3, context_length=64)
    replaying.reply = [785, 151_669]  # an embedding row past the tokenizer's last id
    with pytest.raises(EngineBadOutput, match="id 151669 at 1 is outside the vocabulary of 151669"):
        _generate(engine, [1, 2, 3], SamplingParams(max_new_tokens=8))


def test_a_dead_engine_is_unavailable(
    qwen3: HFTokenizer, replaying: type[ReplayingAsyncLLM], tiny_qwen3_dir: Path
) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    engine = VLLMEngine(tiny_qwen3_dir, tokenizer=qwen3, context_length=64)
    replaying.raise_on_generate = EngineDeadError()
    with pytest.raises(EngineUnavailable, match="EngineDeadError"):
        _generate(engine, [1, 2, 3], SamplingParams(max_new_tokens=8))
    replaying.raise_on_generate = RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(EngineError, match="illegal memory access") as info:
        _generate(engine, [1, 2, 3], SamplingParams(max_new_tokens=8))
    assert not isinstance(info.value, EngineUnavailable)


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
