"""What the tiny test models (`tiny_qwen3.py`, `tiny_qwen_vl.py`) share: the Qwen tokenizer files of a model
directory, the id of the recipe that built it, and the cache that builds it once, atomically, and reuses it while
its recipe is unchanged.

A model directory is built into ``<repo>/.cache/<name>/`` (git-ignored) in a private temporary directory and
renamed into place, so concurrent builders (pytest workers, a benchmark beside a test run) never see half a
directory; the loser of a race discards its copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["REPO", "cached_model_dir", "recipe_id", "write_tokenizer_files"]

REPO = Path(__file__).resolve().parents[2]


def recipe_id(tokenizer_json: Path, recipe: dict[str, Any], chat_template: Path) -> str:
    """A digest of everything that decides a directory's contents: the recipe, the template, the tokenizer."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    digest.update(chat_template.read_bytes())
    digest.update(hashlib.sha256(tokenizer_json.read_bytes()).digest())
    return digest.hexdigest()[:16]


def write_tokenizer_files(
    out_dir: Path, tokenizer_json: Path, *, chat_template: Path, max_length: int, recipe: dict[str, Any]
) -> None:
    """The Qwen tokenizer files (``tokenizer.json``, ``tokenizer_config.json`` with `chat_template`), the recipe
    that built the directory (``recipe.json``, with its id), and every file readable by other users (safetensors
    writes 0600; the directory is shared with other tools: vLLM, a GPU box)."""
    shutil.copyfile(tokenizer_json, out_dir / "tokenizer.json")
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": chat_template.read_text(encoding="utf-8"),
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    built = {"id": recipe_id(tokenizer_json, recipe, chat_template), **recipe}
    (out_dir / "recipe.json").write_text(json.dumps(built, indent=2) + "\n", encoding="utf-8")
    for file in out_dir.iterdir():
        file.chmod(0o644)


def cached_model_dir(
    name: str,
    *,
    build: Callable[[Path], None],
    expected_id: str,
    needed: Sequence[str],
    cache_dir: Path | None = None,
    stamp: str = "recipe.json",
) -> Path:
    """``<cache_dir>/<name>`` (default ``<repo>/.cache``), built first with `build(path)` when it is missing, holds
    another recipe (the id in its `stamp` file, ``recipe.json`` by default, is not `expected_id`) or lacks a `needed`
    file. `build` writes the stamp."""
    target = (cache_dir or REPO / ".cache") / name

    def current() -> bool:
        try:
            written = json.loads((target / stamp).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return False
        return written.get("id") == expected_id and all((target / file).is_file() for file in needed)

    if current():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(scratch / "model")
        if target.exists() and not current():
            os.replace(target, scratch / "stale")  # moved aside, deleted with the scratch directory
        try:
            os.replace(scratch / "model", target)
        except OSError:
            if not current():  # someone else won the race with a good copy, or not
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
