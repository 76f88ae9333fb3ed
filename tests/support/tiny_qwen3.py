"""A tiny random-weight Qwen3 model directory for engine tests, built offline from a ``transformers`` config.

The model has the real Qwen3 architecture and the real Qwen3 tokenizer (vocab 151,669, the chat template, the
eos ids of ``generation_config.json``), but 2 layers of width 64, so it loads in well under a second and
generates a few tokens in milliseconds on a CPU. Its weights are random (a fixed torch seed), so its output is
gibberish: tests compare engines with each other, never against expected text.

The directory is a normal Hugging Face model directory (``config.json``, ``model.safetensors``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``) that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load, and that vLLM can serve.
It is built into ``<repo>/.cache/tiny-qwen3/`` (git-ignored) atomically, and reused while its recipe is
unchanged.

Public API: :data:`TINY_QWEN3_RECIPE`, :func:`build_tiny_qwen3` and :func:`tiny_qwen3_path`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.model_dir import REPO, cached_model_dir, recipe_id, write_tokenizer_files

__all__ = ["TINY_QWEN3_RECIPE", "build_tiny_qwen3", "tiny_qwen3_path"]

_CHAT_TEMPLATE = REPO / "tests" / "data" / "golden" / "templates" / "qwen3.jinja"

IM_END = 151645
ENDOFTEXT = 151643

TINY_QWEN3_RECIPE: dict[str, Any] = {
    "vocab_size": 151_669,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    # Far above the usual 0.02: with tied embeddings a 0.02-initialized tiny model repeats its last token forever,
    # which would let a wrong engine pass a comparison. At 0.3 greedy output varies token to token and the
    # distributions are peaked enough (top logprobs near -4) that near-ties between tokens are rare.
    "initializer_range": 0.3,
    "seed": 1234,
}
"""Everything that decides the weights; a change here rebuilds the cached directory."""


def build_tiny_qwen3(out_dir: Path, tokenizer_json: Path, recipe: dict[str, Any] | None = None) -> None:
    """Write the model directory into `out_dir` (which must not exist yet); `recipe` defaults to
    `TINY_QWEN3_RECIPE`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    chosen = dict(recipe or TINY_QWEN3_RECIPE)
    recipe = dict(chosen)
    seed = recipe.pop("seed")
    rope_theta = recipe.pop("rope_theta")
    config = Qwen3Config(
        **recipe,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
        pad_token_id=ENDOFTEXT,
        dtype="float32",
    )
    model_class: Any = Qwen3ForCausalLM  # transformers is untyped here
    generation_class: Any = GenerationConfig
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).eval()
    model.generation_config = generation_class(
        bos_token_id=ENDOFTEXT, eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT
    )
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    write_tokenizer_files(
        out_dir,
        tokenizer_json,
        chat_template=_CHAT_TEMPLATE,
        max_length=chosen["max_position_embeddings"],
        recipe=chosen,
    )


_NEEDED = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def tiny_qwen3_path(
    tokenizer_json: Path,
    cache_dir: Path | None = None,
    *,
    recipe: dict[str, Any] | None = None,
    name: str = "tiny-qwen3",
) -> Path:
    """The cached model directory, built first if missing or stale. Safe against concurrent builders: each
    builds in a private temporary directory and renames it into place; the loser of a race discards its copy.
    A variant `recipe` (e.g. a head size another backend's kernels support) is cached under its own `name`."""
    chosen = dict(recipe or TINY_QWEN3_RECIPE)
    return cached_model_dir(
        name,
        build=lambda path: build_tiny_qwen3(path, tokenizer_json, chosen),
        expected_id=recipe_id(tokenizer_json, chosen, _CHAT_TEMPLATE),
        needed=_NEEDED,
        cache_dir=cache_dir,
    )
