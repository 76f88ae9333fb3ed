"""`use_gqa_sdpa(model)`: grouped-query attention through torch's SDPA without copying the key/value heads.

transformers' ``sdpa`` attention repeats each key/value head for its group of query heads (`repeat_kv`, a copy of
the whole KV cache per layer and step) whenever an attention mask is passed, which `HFEngine` always does (rows
are left-padded). torch's `scaled_dot_product_attention(..., enable_gqa=True)` (torch >= 2.5) reads the grouped
heads in place; with a mask it is the same call on the same values, so its outputs are those of ``sdpa``
(`tests/agent_runtime/test_engine_hf_attention.py` compares logits, batched and cached). On the CPU with 150 rows
of 300 cached positions, one attention call went from 22 ms to 1.4 ms. Without a mask, without grouped heads, or
with a position bias the call goes to transformers' own ``sdpa`` function unchanged.

`use_gqa_sdpa` switches a text model whose attention is ``sdpa`` and whose heads are grouped to the implementation
registered here as `GQA_SDPA`; anything else is left as it is. The name is not saved with the model (transformers
keeps the implementation out of ``config.json``). This module imports torch and transformers.
"""

from __future__ import annotations

from typing import Any, Final

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["GQA_SDPA", "use_gqa_sdpa"]

GQA_SDPA: Final = "agent_sdpa_gqa"

_TORCH_HAS_GQA: Final = tuple(int(part) for part in torch.__version__.split(".")[:2] if part.isdigit()) >= (2, 5)


def sdpa_gqa_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract; with a mask and grouped heads, SDPA reads the groups in place."""
    if (
        attention_mask is None
        or getattr(module, "num_key_value_groups", 1) == 1
        or kwargs.get("position_bias") is not None
    ):
        out: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
        return out
    # with a mask, transformers' sdpa passes is_causal=False and the mask as it is: so does this call
    attended = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return attended.transpose(1, 2).contiguous(), None


def use_gqa_sdpa(model: Any) -> bool:
    """Switch `model` to `GQA_SDPA` when it is a text model on ``sdpa`` with grouped key/value heads; True if it
    did (or already uses it)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == GQA_SDPA:
        return True
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None)
    switch = getattr(model, "set_attn_implementation", None)
    grouped = isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads < heads
    if implementation != "sdpa" or not grouped or switch is None or not _TORCH_HAS_GQA:
        return False
    if getattr(config, "vision_config", None) is not None:  # its towers have attention settings of their own
        return False
    _register()
    switch(GQA_SDPA)
    return True


def _register() -> None:
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    transformers.AttentionInterface.register(GQA_SDPA, sdpa_gqa_forward)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # the masks of sdpa, built the same way
