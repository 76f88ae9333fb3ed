"""A tiny random-weight Qwen2.5-VL model directory for vision tests, built offline from a ``transformers`` config.

The model has the real Qwen2.5-VL architecture (`Qwen2_5_VLForConditionalGeneration`: a windowed ViT whose
merger feeds 2x2 patches into the language model as one token, 3-D multimodal RoPE) and the real Qwen3 tokenizer,
whose vision tokens the config names (``<|image_pad|>`` 151655, ``<|vision_start|>`` 151652, ``<|vision_end|>``
151653). It is tiny (a 2-block vision tower of width 32, 2 text layers of width 64), so it loads in well under a
second and runs on a CPU in milliseconds. Its weights are random (a fixed torch seed), so its output is gibberish:
tests compare engines with a reference computation, never against expected text.

The image processor is transformers' `Qwen2VLImageProcessor` with a small pixel budget (`MAX_PIXELS`, at most 64
pads per image, `MIN_PIXELS`, at least 4), so test images give few pad tokens. The directory is a normal Hugging
Face model directory (``config.json``, ``model.safetensors``, ``generation_config.json``,
``preprocessor_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` with the Qwen3-VL chat template) that
``AutoModelForImageTextToText``, ``AutoImageProcessor`` and ``HFTokenizer.from_file`` (whose ``.vision`` it sets)
load. It is built into ``<repo>/.cache/tiny-qwen-vl/`` (git-ignored) atomically and reused while its recipe is
unchanged, like ``tests/support/tiny_qwen3.py``.

Public API: :data:`TINY_QWEN_VL_RECIPE` (and :data:`TINY_QWEN_VL_HD32_RECIPE` for vLLM's CPU build),
:data:`IMAGE_PAD`, :func:`build_tiny_qwen_vl`, :func:`tiny_qwen_vl_path` and :func:`offline_processor` (a
transformers ``Qwen2VLProcessor`` on the directory, assembled without network).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.model_dir import REPO, cached_model_dir, recipe_id, write_tokenizer_files

__all__ = [
    "IMAGE_PAD",
    "MAX_PIXELS",
    "MIN_PIXELS",
    "TINY_QWEN3_VL_RECIPE",
    "TINY_QWEN_VL_HD32_RECIPE",
    "TINY_QWEN_VL_RECIPE",
    "build_tiny_qwen_vl",
    "offline_processor",
    "tiny_qwen_vl_path",
]

_CHAT_TEMPLATE = REPO / "tests" / "data" / "golden" / "templates" / "qwen3_vl_instruct.jinja"

IM_END = 151645
ENDOFTEXT = 151643
VISION_START = 151652
VISION_END = 151653
IMAGE_PAD = 151655
VIDEO_PAD = 151656
MIN_PIXELS = 28 * 28 * 4
MAX_PIXELS = 28 * 28 * 64

TINY_QWEN_VL_RECIPE: dict[str, Any] = {
    "text": {
        "vocab_size": 151_669,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        # as in tiny_qwen3: a wide init keeps greedy output from repeating one token, so a wrong engine cannot pass
        "initializer_range": 0.3,
    },
    "rope_theta": 1_000_000.0,
    "mrope_section": [2, 3, 3],  # temporal, height, width halves of the 16-wide heads: 2 + 3 + 3 = 16 / 2
    "vision": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "initializer_range": 0.3,
    },
    "min_pixels": MIN_PIXELS,
    "max_pixels": MAX_PIXELS,
    "seed": 4321,
}
"""Everything that decides the weights and the image grid; a change here rebuilds the cached directory."""

TINY_QWEN_VL_HD32_RECIPE: dict[str, Any] = {
    **TINY_QWEN_VL_RECIPE,
    "text": {**TINY_QWEN_VL_RECIPE["text"], "hidden_size": 128, "intermediate_size": 256},
    "mrope_section": [4, 6, 6],  # 4 + 6 + 6 = 32 / 2
}
"""The same model with text heads of size 32 (width 128): vLLM's CPU attention has no kernel below 32. Cache it
under its own name: ``tiny_qwen_vl_path(tokenizer, recipe=TINY_QWEN_VL_HD32_RECIPE, name="tiny-qwen-vl-hd32")``."""

TINY_QWEN3_VL_RECIPE: dict[str, Any] = {
    "architecture": "qwen3_vl",  # Qwen3VLForConditionalGeneration: interleaved mRoPE, deepstack vision features
    "text": {**TINY_QWEN_VL_RECIPE["text"], "head_dim": 16},
    "rope_theta": 5_000_000.0,
    "mrope_section": [2, 3, 3],
    "vision": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "deepstack_visual_indexes": [0],
        "num_position_embeddings": 64,
        "initializer_range": 0.3,
    },
    "min_pixels": 32 * 32 * 4,
    "max_pixels": 32 * 32 * 64,
    "seed": 4321,
}
"""A tiny Qwen3-VL (patch 16): ``tiny_qwen_vl_path(tokenizer, recipe=TINY_QWEN3_VL_RECIPE, name="tiny-qwen3-vl")``."""

_NEEDED = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _image_processor(recipe: dict[str, Any]) -> Any:
    import transformers

    vision = recipe["vision"]
    # `size` as a new dict: transformers 5.15 writes min/max_pixels arguments into the class's shared default
    size = {"shortest_edge": recipe["min_pixels"], "longest_edge": recipe["max_pixels"]}
    return transformers.Qwen2VLImageProcessor(
        patch_size=vision["patch_size"],
        merge_size=vision["spatial_merge_size"],
        temporal_patch_size=vision["temporal_patch_size"],
        size=size,
    )


def build_tiny_qwen_vl(out_dir: Path, tokenizer_json: Path, recipe: dict[str, Any] | None = None) -> None:
    """Write the model directory into `out_dir` (which must not exist yet); `recipe` defaults to
    `TINY_QWEN_VL_RECIPE` (Qwen2.5-VL; ``"architecture": "qwen3_vl"`` builds a Qwen3-VL)."""
    import torch
    import transformers

    chosen = dict(recipe or TINY_QWEN_VL_RECIPE)
    qwen3 = chosen.get("architecture") == "qwen3_vl"
    config_class: Any = transformers.Qwen3VLConfig if qwen3 else transformers.Qwen2_5_VLConfig
    model_class: Any = (
        transformers.Qwen3VLForConditionalGeneration if qwen3 else transformers.Qwen2_5_VLForConditionalGeneration
    )
    rope = {"rope_type": "default", "rope_theta": chosen["rope_theta"], "mrope_section": list(chosen["mrope_section"])}
    if qwen3:
        rope["mrope_interleaved"] = True
    text = {
        **chosen["text"],
        "rope_parameters": rope,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": IM_END,
        "pad_token_id": ENDOFTEXT,
        "tie_word_embeddings": True,
    }
    vision = {**chosen["vision"], "out_hidden_size": chosen["text"]["hidden_size"]}
    config = config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=True,
        dtype="float32",
    )
    generation_class: Any = transformers.GenerationConfig
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(chosen["seed"])
        model = model_class(config).eval()
    model.generation_config = generation_class(
        bos_token_id=ENDOFTEXT, eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT
    )
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir)
    _image_processor(chosen).save_pretrained(out_dir)
    write_tokenizer_files(
        out_dir,
        tokenizer_json,
        chat_template=_CHAT_TEMPLATE,
        max_length=chosen["text"]["max_position_embeddings"],
        recipe=chosen,
    )


def tiny_qwen_vl_path(
    tokenizer_json: Path,
    cache_dir: Path | None = None,
    *,
    recipe: dict[str, Any] | None = None,
    name: str = "tiny-qwen-vl",
) -> Path:
    """The cached model directory, built first if missing or stale (about a second). Safe against concurrent
    builders: each builds in a private temporary directory and renames it into place."""
    chosen = dict(recipe or TINY_QWEN_VL_RECIPE)
    return cached_model_dir(
        name,
        build=lambda path: build_tiny_qwen_vl(path, tokenizer_json, chosen),
        expected_id=recipe_id(tokenizer_json, chosen, _CHAT_TEMPLATE),
        needed=_NEEDED,
        cache_dir=cache_dir,
    )


def offline_processor(model_dir: Path) -> Any:
    """transformers' `Qwen2VLProcessor` for the directory (its image processor and tokenizer.json), built without
    `AutoProcessor` so nothing is looked up online: what OpenRLHF's `process_prompt_with_images` is given."""
    import transformers

    return transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor.from_pretrained(str(model_dir)),
        tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json")),
        video_processor=transformers.Qwen2VLVideoProcessor(),
    )
