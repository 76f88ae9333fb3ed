"""The demo model: a tiny Qwen3-architecture causal LM (`transformers.Qwen3Config`), and the Hugging Face model
directory it is saved as.

    model = build_demo_model(tokenizer, DemoModelSpec(), seed=0)
    save_model_dir(model, tokenizer, path)          # config, safetensors, tokenizer, chat template
    model = load_demo_model(path)

The directory is an ordinary one: ``config.json``, ``model.safetensors``, ``generation_config.json`` (eos ids
``<|im_end|>`` and ``<|endoftext|>``), ``tokenizer.json`` and ``tokenizer_config.json`` carrying the official
Qwen3-Instruct-2507 chat template (`agent_demo.chat_template`, package data of agent-demo), so
`AutoModelForCausalLM`, `AutoTokenizer` and vLLM load it like any Qwen3 checkpoint.

The default size (4 layers of width 192, about 1.7M parameters) trains on two CPU cores in minutes. This module
imports torch and transformers when a model is built or loaded (`DemoModelSpec` alone needs neither); it knows
nothing about the task or about training.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
import structlog
from tokenizers import Tokenizer

from agent_demo import DEMO_CHAT_TEMPLATE, chat_template

if TYPE_CHECKING:
    from transformers import Qwen3ForCausalLM

__all__ = [
    "DEMO_CHAT_TEMPLATE",
    "DemoModelSpec",
    "build_demo_model",
    "chat_template",
    "is_model_dir",
    "load_demo_model",
    "save_model_dir",
]

logger = structlog.get_logger(__name__)

_MODEL_FILES: Final = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json")


class DemoModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The shape of the demo model (everything in `Qwen3Config` that is not derived from the tokenizer)."""

    hidden_size: int = 192
    num_hidden_layers: int = 4
    intermediate_size: int = 512
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 1024
    rope_theta: float = 10_000.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True


def _token_id(tokenizer: Tokenizer, text: str) -> int:
    found = tokenizer.token_to_id(text)
    if found is None:
        raise ValueError(f"the tokenizer has no {text!r} token; the demo model needs Qwen3's added tokens")
    return int(found)


def build_demo_model(tokenizer: Tokenizer, spec: DemoModelSpec | None = None, *, seed: int = 0) -> Qwen3ForCausalLM:
    """A freshly initialized model whose vocabulary is exactly the tokenizer's (added tokens included)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    spec = spec or DemoModelSpec()
    endoftext, im_end = _token_id(tokenizer, "<|endoftext|>"), _token_id(tokenizer, "<|im_end|>")
    config = Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        initializer_range=spec.initializer_range,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="float32",
    )
    model_class: Any = Qwen3ForCausalLM  # transformers' constructors are untyped
    generation_class: Any = GenerationConfig
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Qwen3ForCausalLM = model_class(config)
    model.generation_config = generation_class(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
    )
    logger.debug("demo_model_built", parameters=sum(p.numel() for p in model.parameters()), seed=seed)
    return model


def _tokenizer_config(model: Any) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chat_template(),
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": int(model.config.max_position_embeddings),
    }


def save_model_dir(model: Any, tokenizer: Tokenizer, path: str | Path) -> Path:
    """Write `model` and `tokenizer` as a Hugging Face model directory at `path` (created, files replaced)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    with _no_transformers_progress_bar(), _deepspeed_not_imported():
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    config = _tokenizer_config(model)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_text(config["chat_template"], encoding="utf-8")
    return out


@contextlib.contextmanager
def _no_transformers_progress_bar() -> Iterator[None]:
    """transformers' "Writing model shards" / "Loading weights" bars off while inside: one per save or load (every
    checkpoint, the ablation's start, the KL reference) would cut through the trainer's own progress bar, or print
    with ``--no-progress``."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _deepspeed_not_imported() -> Iterator[None]:
    """While inside, `import deepspeed` fails and `importlib.util.find_spec("deepspeed")` is None (Python's own
    rule for a ``None`` entry in `sys.modules`), unless DeepSpeed is already imported.

    `save_pretrained` asks accelerate to unwrap the model from a distributed container, and accelerate imports
    DeepSpeed whenever it is installed (it is, for OpenRLHF) to compare the model with `DeepSpeedEngine`. A demo
    model is a plain module, never wrapped; the import takes seconds (tens under load) and prints DeepSpeed's
    "Setting accelerator to CPU" warning on stdout, in a process that does not use DeepSpeed."""
    if "deepspeed" in sys.modules:  # the caller uses DeepSpeed: let accelerate unwrap as it would
        yield
        return
    sys.modules["deepspeed"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("deepspeed", ...) is None:
            del sys.modules["deepspeed"]


def is_model_dir(path: str | Path) -> bool:
    """True when `path` holds every file `save_model_dir` writes that loading needs."""
    return all((Path(path) / name).is_file() for name in _MODEL_FILES)


def load_demo_model(path: str | Path) -> Qwen3ForCausalLM:
    """Load a saved demo model (float32, CPU)."""
    import torch
    import transformers
    from transformers import Qwen3ForCausalLM

    dtype_kwarg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    load: Any = Qwen3ForCausalLM.from_pretrained
    with _no_transformers_progress_bar():
        model: Qwen3ForCausalLM = load(str(path), **{dtype_kwarg: torch.float32})
    return model
