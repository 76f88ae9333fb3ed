"""OpenRLHF's half-open `action_ranges` as a 0/1 loss mask: how the tests check a wire record's ranges against
the transcript record's mask (the trainers read the mask itself and never convert)."""

from __future__ import annotations

from collections.abc import Sequence


def loss_mask_from_ranges(length: int, action_ranges: Sequence[Sequence[int]]) -> list[int]:
    """OpenRLHF's half-open `action_ranges` as a 0/1 mask over `length` tokens."""
    mask = [0] * length
    for start, end in action_ranges:
        if not 0 <= start <= end <= length:
            raise ValueError(f"action range ({start}, {end}) is outside a sequence of {length} tokens")
        mask[start:end] = [1] * (end - start)
    return mask
