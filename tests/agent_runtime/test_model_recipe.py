"""A model without a recipe gets one derived from its directory: on the tiny random-weight Qwen3 (real config,
real tokenizer and chat template) the protocol is the template's, the context is max_position_embeddings and a
turn's limit a default that fits it, never the demo recipe's 32 tokens in 512; generation_config.json's limit and
sampling are taken when it sets them; a family no protocol is registered for is refused, naming them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer, list_protocols
from agent_runtime.model_recipe import DEFAULT_MAX_NEW_TOKENS, recipe_for_model
from agent_runtime.recipe import RecipeError

CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json")


def config_copy(model: Path, target: Path) -> Path:
    """The model directory's JSON files only (what a recipe is derived from), to edit in a test."""
    target.mkdir()
    for name in CONFIG_FILES:
        shutil.copyfile(model / name, target / name)
    return target


def edit(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_the_tiny_qwen3_gets_its_own_limits_and_protocol(tiny_qwen3_dir: Path, qwen3_tokenizer_file: Path) -> None:
    recipe = recipe_for_model(tiny_qwen3_dir)
    assert recipe.name == "tiny-qwen3" and recipe.protocol == "qwen3"  # the hybrid template of the golden data
    assert recipe.max_context_tokens == 4096  # config.json's max_position_embeddings
    assert recipe.max_new_tokens == recipe.sampling.max_new_tokens == 2048  # the default, capped at half the context
    assert recipe.sampling.temperature == 1.0  # generation_config.json sets no sampling: transformers' defaults
    assert recipe.environment().tools == [] and recipe.rewards is None and recipe.system_prompt is None
    session = recipe.make_session(HFTokenizer.from_file(qwen3_tokenizer_file))
    assert (session.max_new_tokens, session.max_context_tokens) == (2048, 4096)
    assert recipe_for_model(tiny_qwen3_dir, context_length=100_000).max_new_tokens == DEFAULT_MAX_NEW_TOKENS


def test_generation_config_limits_and_sampling_are_taken(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    model = config_copy(tiny_qwen3_dir, tmp_path / "tuned")
    edit(model / "generation_config.json", max_new_tokens=300, temperature=0.6, top_p=0.95, top_k=20)
    recipe = recipe_for_model(model, name="tuned-agent")
    assert recipe.name == "tuned-agent" and recipe.max_new_tokens == 300
    assert (recipe.sampling.temperature, recipe.sampling.top_p, recipe.sampling.top_k) == (0.6, 0.95, 20)
    edit(model / "generation_config.json", do_sample=False, max_new_tokens=100_000)
    greedy = recipe_for_model(model)
    assert greedy.sampling.temperature == 0.0 and greedy.max_new_tokens == 2048  # never more than half the context


def test_a_template_family_without_a_protocol_is_refused(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    model = config_copy(tiny_qwen3_dir, tmp_path / "other")
    edit(model / "config.json", model_type="llama")
    edit(
        model / "tokenizer_config.json",
        chat_template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
    )
    with pytest.raises(RecipeError) as caught:
        recipe_for_model(model)
    message = str(caught.value)
    assert str(model) in message and "model_type 'llama'" in message
    assert ", ".join(list_protocols()) in message and "--recipe" in message


def test_a_config_without_a_context_length_needs_one_given(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    model = config_copy(tiny_qwen3_dir, tmp_path / "unsized")
    config = json.loads((model / "config.json").read_text())
    del config["max_position_embeddings"]
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(RecipeError, match=r"config\.json names no max_position_embeddings.*--context-length"):
        recipe_for_model(model)
    assert recipe_for_model(model, context_length=1000).max_context_tokens == 1000
    with pytest.raises(RecipeError, match="does not exist"):
        recipe_for_model(tmp_path / "missing")
