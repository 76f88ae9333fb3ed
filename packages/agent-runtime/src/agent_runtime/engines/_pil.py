"""`decode_image`: an image reference (`agent_protocol.images`) read and decoded into an RGB Pillow image, for the
engines that hand images to a model (`hf` through its image processor, `vllm` in `multi_modal_data`).

The image is decoded by `agent_env.image_decoder.decode_image`: its size is the one every frame header says and
Pillow agrees on (the size the prompt's pads were counted from), it is opened as the one format its header names,
and a body that does not decode is refused before or while Pillow decodes it. Pillow is imported when an image is
decoded, never at import time, so engine modules stay importable without it (the `vision` extra). A reference that
cannot be read or decoded is a `ValueError` naming the image."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_env.image_decoder import decode_image as decode_bytes
from agent_env.image_decoder import has_decoder
from agent_protocol.images import read_image

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["decode_image"]


def decode_image(url: str, *, engine: str, index: int) -> Image:
    """Image `index` of a request (its reference `url`), as RGB. ValueError when it cannot be read or decoded."""
    if not has_decoder():
        raise ValueError(f"{engine}: decoding images needs Pillow: install agent-runtime[vision]")
    try:
        data = read_image(url)
    except ValueError as e:
        raise ValueError(f"{engine}: image {index}: {e}") from e
    try:
        picture = decode_bytes(data)
    except ValueError as e:  # "the image cannot be decoded: ..." reads "image 3 cannot be decoded: ..."
        problem = str(e)
        named = f" {problem.removeprefix('the image ')}" if problem.startswith("the image ") else f": {problem}"
        raise ValueError(f"{engine}: image {index}{named}") from e
    if picture.mode == "RGB":  # already what the processor takes: no second copy of the pixels
        return picture
    try:
        return picture.convert("RGB")
    except Exception as e:  # Pillow raises its own errors (and OSError) while converting a corrupt body
        raise ValueError(f"{engine}: image {index} cannot be decoded: {type(e).__name__}: {e}") from e
    finally:
        picture.close()
