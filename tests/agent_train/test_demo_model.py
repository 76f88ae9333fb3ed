"""The demo model directory is an ordinary Hugging Face Qwen3 checkpoint: transformers loads model and tokenizer
from it, the `hf` engine serves it with the right stop tokens, and the expert's episodes run through it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agent_demo.recipe import make_recipe  # noqa: E402
from agent_demo.tokenizer import train_demo_tokenizer  # noqa: E402
from agent_protocol import HFTokenizer  # noqa: E402
from agent_runtime import SamplingParams  # noqa: E402
from agent_runtime.engines.hf import HFEngine  # noqa: E402
from agent_train.demo.model import (  # noqa: E402
    build_demo_model,
    chat_template,
    is_model_dir,
    load_demo_model,
    save_model_dir,
)
from tests.support.tiny_demo import TINY_DEMO_SPEC  # noqa: E402

RECIPE = make_recipe()
SMALL = TINY_DEMO_SPEC


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = train_demo_tokenizer(RECIPE.chat_protocol(), RECIPE.environment().tools, episodes=500)
    path = tmp_path_factory.mktemp("demo-model")
    save_model_dir(build_demo_model(raw, SMALL, seed=0), raw, path)
    return path


def test_the_directory_holds_a_qwen3_checkpoint(model_dir: Path) -> None:
    assert is_model_dir(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    tokenizer = HFTokenizer.from_file(model_dir)
    assert config["vocab_size"] == tokenizer.vocab_size
    eos = json.loads((model_dir / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == chat_template()
    assert "<|im_start|>assistant" in chat_template()


def test_transformers_loads_it_and_the_weights_round_trip(model_dir: Path) -> None:
    auto = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    ours = load_demo_model(model_dir)
    assert type(auto).__name__ == "Qwen3ForCausalLM"
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(auto(input_ids=ids).logits, ours(input_ids=ids).logits)
    fresh = build_demo_model(train_demo_tokenizer(RECIPE.chat_protocol(), RECIPE.environment().tools, episodes=500),
                             SMALL, seed=0)  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), ours.state_dict().values(), strict=True))


def test_the_hf_engine_serves_it(model_dir: Path) -> None:
    engine = HFEngine.from_pretrained(model_dir)
    tokenizer = engine.tokenizer
    assert engine.stop_token_ids == (tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>"))
    prompt = tokenizer.encode(RECIPE.chat_protocol().render_prompt([{"role": "user", "content": "What is 1 * 2 + 3?"}]))
    generation = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=5, temperature=0.0)))
    assert 1 <= len(generation.ids) <= 5 and generation.logprobs is not None
    asyncio.run(engine.close())
