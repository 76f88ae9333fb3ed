"""LLM engines, one module per backend. Heavy backends (`hf`, `vllm`) are imported only when asked for:
`HFEngine`, `VLLMEngine` and `OpenAIEngine` are resolved on first attribute access, so importing this package
never imports torch, transformers, vllm or httpx."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agent_runtime.engines.base import (
    FinishReason,
    Generation,
    LLMEngine,
    SamplingParams,
    check_versions,
    checked_policy_version,
    plain_ids,
    tokenizer_vocab_size,
    validate_generation,
)
from agent_runtime.engines.registry import ENGINE_KINDS, make_engine
from agent_runtime.engines.scripted import Policy, ScriptedEngine

if TYPE_CHECKING:
    from agent_runtime.engines.hf import HFEngine
    from agent_runtime.engines.openai_http import OpenAIEngine
    from agent_runtime.engines.vllm import VLLMEngine

__all__ = [
    "ENGINE_KINDS",
    "FinishReason",
    "Generation",
    "HFEngine",
    "LLMEngine",
    "OpenAIEngine",
    "Policy",
    "SamplingParams",
    "ScriptedEngine",
    "VLLMEngine",
    "check_versions",
    "checked_policy_version",
    "make_engine",
    "plain_ids",
    "tokenizer_vocab_size",
    "validate_generation",
]

_LAZY = {
    "HFEngine": "agent_runtime.engines.hf",
    "OpenAIEngine": "agent_runtime.engines.openai_http",
    "VLLMEngine": "agent_runtime.engines.vllm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
