"""`decode_image`: an image reference (`agent_protocol.images`) read and decoded into an RGB Pillow image, for the
engines that hand images to a model (`hf` through its image processor, `vllm` in `multi_modal_data`).

Pillow is imported when an image is decoded, never at import time, so engine modules stay importable without
it (the `vision` extra). A reference that cannot be read or decoded is a `ValueError` naming the image."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from agent_protocol.images import read_image

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["decode_image"]


def decode_image(url: str, *, engine: str, index: int) -> Image:
    """Image `index` of a request (its reference `url`), as RGB. ValueError when it cannot be read or decoded."""
    try:
        from PIL import Image as pil
    except ImportError as e:
        raise ValueError(f"{engine}: decoding images needs Pillow: install agent-runtime[vision]") from e
    try:
        data = read_image(url)
    except ValueError as e:
        raise ValueError(f"{engine}: image {index}: {e}") from e
    try:
        with pil.open(io.BytesIO(data)) as picture:
            return picture.convert("RGB")
    except Exception as e:  # Pillow raises its own errors (and OSError) for a corrupt body
        raise ValueError(f"{engine}: image {index} cannot be decoded: {type(e).__name__}: {e}") from e
