"""`TransposedHead`: a decode step's logits on the CPU from the output layer's weight stored transposed.

`nn.Linear` keeps the output layer's weight as ``[vocab, hidden]``; on the CPU, a float32 product of a few rows
with that layout runs several times slower than the same product with the weight stored ``[hidden, vocab]``
(measured on this project's 2-core machine, MKL: one row against 151,669 x 64 weights 4.5 ms vs 1.1 ms, x 256
14.8 ms vs 5.7 ms, x 1024 33.7 ms vs 25.0 ms; at 8 rows the two are even). A decode step computes exactly that
product (one row per running sequence), and on a model with a large vocabulary and a small width, such as the
tests' tiny Qwen3, it is most of the step. The values are the same sums: the tests compare them with the model's
own logits.

`TransposedHead.of(model)` returns a head only where it is sure to give the model's logits: a stock transformers
Llama, Mistral, Qwen2 or Qwen3 causal LM (their forward is ``lm_head(hidden_states)``, nothing after it), whose
output layer is a float32 `nn.Linear` without bias on the CPU, at most `MAX_BYTES` (the copy doubles the
layer's memory). Anything else gets None and runs the model's own forward. The copy is remade when the weight
changes (its version counter or storage moves: an optimizer step, `load_state_dict`), so a trainer sharing the
model never reads stale logits. Called from one thread (the engine's worker).
"""

from __future__ import annotations

from typing import Any, Final

import torch

__all__ = ["MAX_BYTES", "MAX_ROWS", "TransposedHead"]

#: the largest output layer copied (bytes of its weight): above it, the model's own forward
MAX_BYTES: Final = 1 << 30
#: the most rows computed this way; beyond them `nn.Linear`'s layout is as fast (see the module docstring)
MAX_ROWS: Final = 4

# Causal LMs whose forward is `logits = lm_head(model(...).last_hidden_state)`, with no scaling or softcapping.
_PLAIN_HEADS: Final = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})


class TransposedHead:
    """The backbone of a plain causal LM and its output layer, with the layer's weight kept transposed."""

    def __init__(self, backbone: Any, linear: torch.nn.Linear) -> None:
        self.backbone = backbone
        self.linear = linear
        self._weight_t: torch.Tensor | None = None
        self._seen: tuple[int, int] | None = None

    @classmethod
    def of(cls, model: Any) -> TransposedHead | None:
        """A head for `model` when it qualifies (see the module docstring), else None."""
        kind = type(model)
        if kind.__name__ not in _PLAIN_HEADS or not kind.__module__.startswith("transformers.models."):
            return None
        linear = model.get_output_embeddings()
        backbone = getattr(model, "model", None)
        if type(linear) is not torch.nn.Linear or linear.bias is not None or backbone is None:
            return None
        weight = linear.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return None
        if weight.numel() * weight.element_size() > MAX_BYTES:
            return None
        return cls(backbone, linear)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of `hidden` (rows x width, the backbone's last positions): rows x vocab."""
        weight = self.linear.weight
        seen = (weight._version, weight.data_ptr())
        if self._weight_t is None or seen != self._seen:
            self._weight_t = weight.detach().t().contiguous()
            self._seen = seen
        return hidden @ self._weight_t
