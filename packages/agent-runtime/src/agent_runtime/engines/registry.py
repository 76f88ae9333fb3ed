"""`make_engine(kind, **options)`: build an `LLMEngine` by name, for apps and configs that pick one at run time.

Kinds and their options:

- "hf": `model` (a model directory or id) plus `HFEngine.from_pretrained` options (`device`, `dtype`, ...);
- "vllm": `model` plus `VLLMEngine` options (`context_length`, `gpu_memory_utilization`, `engine_args`, ...);
- "openai": `OpenAIEngine` options (`base_url`, `model`, `tokenizer`, `context_length`, `api_key`, ...);
- "scripted": `ScriptedEngine` options (`tokenizer`, `script` or `policy`, ...).

Each backend module is imported only when its kind is asked for, so choosing "openai" never imports torch. A
missing optional dependency raises `EngineUnavailable` naming the extra to install. This module knows the
names of the engines and nothing else about them.
"""

from __future__ import annotations

from typing import Any

from agent_protocol import load_tokenizer
from agent_runtime.engines.base import LLMEngine
from agent_runtime.errors import EngineUnavailable

__all__ = ["ENGINE_KINDS", "make_engine"]

ENGINE_KINDS = ("hf", "vllm", "openai", "scripted")


def make_engine(kind: str, **options: Any) -> LLMEngine:
    """Build the engine `kind` from keyword options (see the module docstring)."""
    if kind == "hf":
        model = _pop_model(kind, options)
        try:
            from agent_runtime.engines.hf import HFEngine
        except ImportError as e:
            raise EngineUnavailable(f"hf: {e}") from e
        return HFEngine.from_pretrained(model, **options)
    if kind == "vllm":
        model = _pop_model(kind, options)
        from agent_runtime.engines.vllm import VLLMEngine

        return VLLMEngine(model, **options)
    if kind == "openai":
        from agent_runtime.engines.openai_http import OpenAIEngine

        return OpenAIEngine(**options)
    if kind == "scripted":
        from agent_runtime.engines.scripted import ScriptedEngine

        tokenizer = options.pop("tokenizer", None)
        if tokenizer is None:
            raise TypeError("make_engine('scripted') needs tokenizer=")
        return ScriptedEngine(load_tokenizer(tokenizer), **options)
    raise ValueError(f"unknown engine kind {kind!r}; choose one of: {', '.join(ENGINE_KINDS)}")


def _pop_model(kind: str, options: dict[str, Any]) -> Any:
    if "model" not in options:
        raise TypeError(f"make_engine({kind!r}) needs model= (a model directory or id)")
    return options.pop("model")
