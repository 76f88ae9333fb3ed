"""`VisionInputs`: what `HFEngine` adds to an image prompt before a vision-language model can run it.

A Qwen2-VL-style model (Qwen2-VL, Qwen2.5-VL in transformers: a config with a `vision_config` and an
`image_token_id`) takes its prompt with each image's run of ``<|image_pad|>`` already expanded, plus the pixels:
`pixel_values` and `image_grid_thw` from the model directory's image processor (``preprocessor_config.json``, a
`Qwen2VLImageProcessor`), and 3-D multimodal RoPE positions from the model's own `get_rope_index`. `prepare`
builds those for one prompt:

- each image reference is read and decoded with Pillow (RGB, `agent_env.image_decoder.decode_reference`), in the
  order of the prompt's runs of pads;
- the image processor gives the pixels and each image's (t, h, w) grid; the runs of pads in the prompt must be as
  long as the grids say (t*h*w / merge_size**2, as the processor expands them), or `ValueError` names the image;
- the positions of the whole prompt, shape (3, 1, len): text counts on by one in all three sections, an image's
  pads carry their (t, h, w) place, as the model computes them for its own `generate`.

Errors in the caller's input (an unreadable image, a pad run of the wrong length, pads without images) are
`ValueError` with a message that says which. The engine runs an image prompt alone (not batched with others) and
outside its prefix cache: a kept prefix is keyed by token ids, and the pads of two different images are the same
ids. This module knows no chat format; it imports torch, transformers and Pillow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agent_env import decode_reference
from agent_protocol import image_spans

__all__ = ["ImageInputs", "VisionInputs", "is_vision_model"]


@dataclass(frozen=True, slots=True)
class ImageInputs:
    """One prompt's model inputs beyond its ids: the processor's `pixel_values` and `image_grid_thw`, and the
    prompt's 3-D RoPE `positions` (3, 1, len(prompt))."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    positions: torch.Tensor


def is_vision_model(model: Any) -> bool:
    """Whether `model` is a Qwen2-VL-style vision-language model this module can feed."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    return (
        getattr(config, "vision_config", None) is not None
        and isinstance(getattr(config, "image_token_id", None), int)
        and callable(getattr(inner, "get_rope_index", None))
    )


class VisionInputs:
    """The image side of one `HFEngine`: its model (for `get_rope_index`) and its image processor."""

    def __init__(self, model: Any, image_processor: Any) -> None:
        if not is_vision_model(model):
            raise ValueError(f"hf: {type(model).__name__} is not a Qwen2-VL-style vision-language model")
        self.model = model
        self.image_processor = image_processor
        self.pad_id = int(model.config.image_token_id)
        merge = getattr(image_processor, "merge_size", None) or model.config.vision_config.spatial_merge_size
        self.merge_size = int(merge)

    def prepare(self, prompt: Sequence[int], images: Sequence[str]) -> ImageInputs:
        """The pixels and positions of `prompt` (its pads expanded) for `images` (their references, in pad
        order). ValueError when an image cannot be read or the pads do not match the images."""
        try:
            spans = image_spans(prompt, pad_id=self.pad_id, sources=[f"image {k}" for k in range(len(images))])
        except ValueError as e:
            raise ValueError(f"hf: {e} (each image's pads must be one run, expanded)") from e
        pictures = [decode_reference(url, label=f"hf: image {k}") for k, url in enumerate(images)]
        try:
            processed = self.image_processor(images=pictures, return_tensors="pt")
        except Exception as e:  # the processor refuses sizes it cannot resize (aspect ratio, tiny images)
            raise ValueError(f"hf: the image processor refused the images: {type(e).__name__}: {e}") from e
        grid = processed["image_grid_thw"].long()
        for k, (span, (t, h, w)) in enumerate(zip(spans, grid.tolist(), strict=True)):
            expected = t * h * w // self.merge_size**2
            if span.end - span.start != expected:
                raise ValueError(
                    f"hf: image {k} has {span.end - span.start} pad tokens in the prompt, but its grid "
                    f"{t}x{h}x{w} (merge size {self.merge_size}) gives {expected}: the prompt was expanded for "
                    "another image size or image processor"
                )
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        device = next(self.model.parameters()).device
        positions, _ = self.model.model.get_rope_index(
            ids.to(device), mm_token_type_ids=(ids == self.pad_id).int().to(device), image_grid_thw=grid.to(device)
        )
        return ImageInputs(
            pixel_values=processed["pixel_values"].to(device, self.model.dtype),
            image_grid_thw=grid.to(device),
            positions=positions,
        )
