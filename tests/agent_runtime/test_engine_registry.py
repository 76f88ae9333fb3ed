"""make_engine: each kind builds its engine from keyword options, and an unknown kind names the known ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent_runtime.engines import ENGINE_KINDS, OpenAIEngine, SamplingParams, ScriptedEngine, make_engine


def test_an_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown engine kind 'tgi'; choose one of: hf, vllm, openai, scripted"):
        make_engine("tgi")
    assert ENGINE_KINDS == ("hf", "vllm", "openai", "scripted")


def test_scripted_takes_a_tokenizer_path(qwen3_tokenizer_file: Path) -> None:
    engine = make_engine("scripted", tokenizer=qwen3_tokenizer_file, script=["Hello!<|im_end|>"])
    assert isinstance(engine, ScriptedEngine)
    generation = asyncio.run(engine.generate([1, 2], SamplingParams()))
    assert generation.ids[-1] == 151645 and generation.finish_reason == "stop"


def test_openai_builds_a_client_without_touching_the_network(qwen3_tokenizer_file: Path) -> None:
    engine = make_engine(
        "openai", base_url="http://127.0.0.1:9/v1/", model="m", tokenizer=qwen3_tokenizer_file, context_length=8192
    )
    assert isinstance(engine, OpenAIEngine)
    assert engine.base_url == "http://127.0.0.1:9/v1"
    assert engine.stop_token_ids == (151645, 151643)
    asyncio.run(engine.close())


def test_hf_loads_a_model_directory(tiny_qwen3_dir: Path) -> None:
    from agent_runtime.engines.hf import HFEngine

    engine = make_engine("hf", model=tiny_qwen3_dir, dtype="float32")
    assert isinstance(engine, HFEngine)
    assert engine.context_length == 4096
    asyncio.run(engine.close())


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_a_model_backend_needs_a_model(kind: str) -> None:
    with pytest.raises(TypeError, match="needs model="):
        make_engine(kind)
