"""`greedy_reference`: the ids transformers' own `generate` gives greedily for a prompt, alone and whole (no kept
prefix, no batch): what the engine tests compare `HFEngine`'s ids with. Imports torch (engine tests only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["greedy_reference"]


def greedy_reference(model: Any, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy ids from transformers' own `generate` over the whole prompt (no kept prefix)."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([list(prompt)]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False,
        )  # fmt: skip
    return [int(i) for i in out[0, len(prompt) :]]
