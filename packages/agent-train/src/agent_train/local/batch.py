"""Token batches for the local trainer: right-padded tensors of token sequences with their loss masks, and the
per-token log-probabilities a causal LM gives them.

    batch = pad_batch([ids, ...], [loss_mask, ...], pad_id=pad)
    logprobs = token_logprobs(model, batch)   # [B, T-1]: logprob of token t+1 given tokens <= t
    mask = batch.target_mask                  # [B, T-1]: 1 where token t+1 is a trained (action) token

Everything is aligned on the *targets*: position t of `token_logprobs` and `target_mask` is about token t+1 of the
sequence, so a loss is `(-(logprobs) * mask).sum() / mask.sum()`. This module knows torch; nothing about chats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TokenBatch", "pad_batch", "token_logprobs", "values_on_targets"]


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded sequences. `loss_mask` marks trained tokens; `target_mask` is it shifted onto targets."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] float

    @property
    def target_mask(self) -> torch.Tensor:
        return self.loss_mask[:, 1:]

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[:, 1:]


def pad_batch(
    ids: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    *,
    pad_id: int,
) -> TokenBatch:
    """Right-pad `ids` and `loss_masks` (one per sequence, same lengths) into a `TokenBatch`."""
    if len(ids) != len(loss_masks) or not ids:
        raise ValueError(f"need one loss mask per sequence and at least one sequence, got {len(ids)}/{len(loss_masks)}")
    width = max(len(seq) for seq in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.float32)
    for row, (seq, seq_mask) in enumerate(zip(ids, loss_masks, strict=True)):
        if len(seq) != len(seq_mask):
            raise ValueError(f"sequence {row} has {len(seq)} ids and {len(seq_mask)} mask values")
        input_ids[row, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        attention[row, : len(seq)] = 1
        mask[row, : len(seq)] = torch.tensor(list(seq_mask), dtype=torch.float32)
    return TokenBatch(input_ids=input_ids, attention_mask=attention, loss_mask=mask)


def values_on_targets(values: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Per-token values (e.g. rollout logprobs, one per id) as a [B, width-1] tensor aligned on targets."""
    out = torch.zeros((len(values), width - 1), dtype=torch.float32)
    for row, seq in enumerate(values):
        tail = list(seq)[1:width]
        out[row, : len(tail)] = torch.tensor(tail, dtype=torch.float32)
    return out


def token_logprobs(model: Any, batch: TokenBatch, *, trained_only: bool = False) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for every position, shape [B, T-1] (float32).

    `trained_only`: on a model whose head is a plain projection (`_PLAIN_HEADS`), only the positions of
    `batch.target_mask` go through the head and its log-softmax and the rest are 0: the same values where the mask
    is set, for a loss that multiplies by it, without projecting the prompt and tool results onto the vocabulary.
    Other models get every position either way."""
    kind = type(model)
    if not trained_only or kind.__name__ not in _PLAIN_HEADS or not kind.__module__.startswith("transformers."):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        return _target_logprobs(out.logits[:, :-1, :], batch.targets)
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    where = batch.target_mask > 0
    picked = _target_logprobs(model.lm_head(hidden.last_hidden_state[:, :-1][where]), batch.targets[where])
    return picked.new_zeros(where.shape).masked_scatter(where, picked)


def _target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The log-softmax of `logits` (float32) at each of `targets` (one per row of the last dimension)."""
    logprobs: torch.Tensor = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logprobs


_PLAIN_HEADS = frozenset({"Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"})
"""Causal LMs whose logits are `lm_head(model(...).last_hidden_state)`, nothing else (no scaling, no softcap)."""
