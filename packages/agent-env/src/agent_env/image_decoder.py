"""Images decoded under a pixel budget: `decode_image` (the first frame as Pillow decodes it, or ValueError),
`checked_size` (the size an image really decodes to, within a budget) and `decode_reference` (the image a reference
names, in RGB, for an engine's image processor or vLLM). This is the one place the project opens an image with
Pillow: tools, the server's checks and the engines all decode here.

The size of an image is not trusted from its first header: `agent_protocol.image_format.read_header` reads every
frame's header and refuses frames that do not fit the image, and the budget (`max_pixels`) is checked on that
size before anything is allocated. Then Pillow opens the image as the one format its header names (no guessing
of another format for the same bytes) and must agree: the size it reports and every tile it would decode must
be the header's, or the image is refused before Pillow allocates a pixel. Only then is the first frame decoded
(the one frame OpenRLHF's loader and the engines use), so a truncated body, a corrupt bitstream or a palette
Pillow cannot convert is a `ValueError` here. The budget is in bytes as well as pixels: ``max_pixels`` at 4
bytes each (`BYTES_PER_PIXEL`, the most Pillow stores per pixel), against what decoding the file takes
(`ImageHeader.decode_bytes`): a WebP (libwebp's canvas besides Pillow's copy) or a progressive JPEG (its whole
coefficient buffer) is refused at fewer pixels than a PNG, so no decode holds more than the budget's bytes. The
limit is passed on each call; Pillow's process-wide ``Image.MAX_IMAGE_PIXELS`` is left as it is.

`ImageTooLarge` (a ValueError) says an image is over the budget, as opposed to broken. Pillow is imported on the
first decode, never at import time (it is the ``vision`` extra); without it `checked_size` checks the structure
only, and `decode_image` raises ValueError saying Pillow is missing. This module knows image bytes, image
references (`agent_protocol.images.read_image`) and Pillow; nothing about tools, engines or requests.
"""

from __future__ import annotations

import importlib.util
import io
from typing import TYPE_CHECKING, Final

from agent_protocol import ImageHeader, read_header, read_image

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["BYTES_PER_PIXEL", "ImageTooLarge", "checked_size", "decode_image", "decode_reference", "has_decoder"]

#: the most bytes one decoded pixel takes in Pillow (RGB is stored in 4 bytes, as RGBA, I and F are)
BYTES_PER_PIXEL: Final = 4

#: Pillow's name for each format `read_header` tells apart: an image is opened as that format only
_PIL_FORMAT: Final = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP", "bmp": "BMP"}


class ImageTooLarge(ValueError):
    """The image is well formed but has more pixels than the caller's budget."""


def has_decoder() -> bool:
    """Whether Pillow is installed, so that `checked_size` decodes images (else it reads their structure only)."""
    return importlib.util.find_spec("PIL") is not None


def checked_size(data: bytes, *, max_pixels: int | None) -> tuple[int, int]:
    """(width, height) of the image in `data` if it decodes (with Pillow, when installed) within `max_pixels`
    pixels; `ImageTooLarge` over the budget, ValueError saying what is wrong otherwise. The decoded pixels are
    dropped at once: this only proves that the image can be decoded, at the size its header says."""
    if not has_decoder():
        header = read_header(data)
        _check_budget(header, max_pixels)
        return header.width, header.height
    picture = decode_image(data, max_pixels=max_pixels)
    size: tuple[int, int] = picture.size
    picture.close()
    return size


def decode_image(data: bytes, *, max_pixels: int | None = None) -> Image:
    """The first frame of the image in `data`, decoded by Pillow (in the mode it decodes to), if its size is the
    one its frame headers say and within `max_pixels` (None: no budget of the caller's, only Pillow's own). Raises
    `ImageTooLarge` or ValueError, before any pixel is allocated where the sizes alone refuse it."""
    header = read_header(data)
    _check_budget(header, max_pixels)
    width, height = header.width, header.height
    try:
        from PIL import Image as pil
    except ImportError as e:
        raise ValueError("decoding images needs Pillow: install agent-env[vision] or agent-runtime[vision]") from e
    try:
        picture = pil.open(io.BytesIO(data), formats=[_PIL_FORMAT[header.format]])
    except Exception as e:  # Pillow raises its own errors (SyntaxError, OSError, DecompressionBombError, ...)
        raise ValueError(f"the image cannot be decoded: {type(e).__name__}: {e}") from e
    try:
        if picture.size != (width, height):
            raise ValueError(
                f"the decoder reads a {picture.size[0]}x{picture.size[1]} image where the header says {width}x{height}"
            )
        for tile in picture.tile:
            extents = tile[1]  # (left, top, right, bottom); None: the whole image
            if extents is not None and (min(extents[:2]) < 0 or extents[2] > width or extents[3] > height):
                raise ValueError(f"the image's data reaches outside its {width}x{height} size ({extents})")
        try:
            picture.load()
            picture.crop((0, 0, 1, 1)).convert("RGB")  # a palette or mode the engines' RGB conversion refuses
        except Exception as e:
            raise ValueError(f"the image cannot be decoded: {type(e).__name__}: {e}") from e
    except BaseException:
        picture.close()
        raise
    return picture


def decode_reference(url: str, *, label: str = "the image", max_pixels: int | None = None) -> Image:
    """The image `url` refers to (a data URL, a ``file://`` URL or a path: `read_image`), decoded by `decode_image`
    and in RGB (a picture already in RGB is returned as decoded, not copied). ValueError when it cannot be read or
    decoded, naming the image as `label` ("hf: image 3 cannot be decoded: ...")."""
    if not has_decoder():
        raise ValueError(f"{label}: decoding images needs Pillow: install agent-env[vision] or agent-runtime[vision]")
    try:
        data = read_image(url)
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from e
    try:
        picture = decode_image(data, max_pixels=max_pixels)
    except ValueError as e:  # "the image cannot be decoded: ..." reads "image 3 cannot be decoded: ..."
        problem = str(e)
        named = f" {problem.removeprefix('the image ')}" if problem.startswith("the image ") else f": {problem}"
        raise ValueError(f"{label}{named}") from e
    if picture.mode == "RGB":  # already what the processor takes: no second copy of the pixels
        return picture
    try:
        return picture.convert("RGB")
    except Exception as e:  # Pillow raises its own errors (and OSError) while converting a corrupt body
        raise ValueError(f"{label} cannot be decoded: {type(e).__name__}: {e}") from e
    finally:
        picture.close()


def _check_budget(header: ImageHeader, max_pixels: int | None) -> None:
    if max_pixels is None:
        return
    width, height = header.width, header.height
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}")
    if header.decode_bytes > BYTES_PER_PIXEL * max_pixels:
        raise ImageTooLarge(
            f"decoding this {width}x{height} {header.format.upper()} takes about {header.decode_bytes >> 20} MiB "
            f"({header.decode_bytes / (width * height):.1f} bytes a pixel); the limit is {max_pixels} pixels at "
            f"{BYTES_PER_PIXEL} bytes, {BYTES_PER_PIXEL * max_pixels >> 20} MiB"
        )
