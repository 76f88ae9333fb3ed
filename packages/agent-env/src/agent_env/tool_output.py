"""What a tool returns to show the model images: `ToolOutput`, and the check each image passes at the tool
boundary (`ImageLimits`, `check_tool_images`).

A tool that only has text returns it as before (a string, or any value, written as JSON). A tool that has images
returns ``ToolOutput(text, images=[...])``; each image is either

- `bytes`: the file's bytes of a PNG, JPEG, GIF, WebP or BMP image; it travels on as a
  ``data:image/<type>;base64,...`` URL, the type read from the image's header; or
- `str`: a reference `agent_protocol.images.check_image_url` accepts (a data URL, a ``file://`` URL or a local
  path), kept as given. It is read here to be checked and read again where the image is used (tokenized, sent
  to the engine), so a file must outlive the episode.

The tool runner checks every image before it builds the observation (`check_tool_images`): an image that cannot
be read or is not of a known type, one over `ImageLimits.max_image_bytes` bytes or `max_image_pixels` pixels,
more than `max_images` images or `max_total_pixels` pixels from one call, or an image that does not decode make
the call an ``invalid_image`` failure whose message names the image (``images[k]``) and what is wrong with it.
Sizes come from every frame header (`agent_protocol.images.image_size`), all checked before any image is
decoded; then each is decoded (`image_decoder.checked_size`, with Pillow when installed), one at a time, within
`max_image_pixels`: the same rules a server applies to its clients' images.

This module knows image references and limits; it knows nothing about observations, tools or chat formats.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlparse

import msgspec

from agent_env.image_decoder import checked_size
from agent_protocol import check_image_url, image_size, read_header, read_image

__all__ = ["DEFAULT_IMAGE_LIMITS", "ImageLimits", "ToolOutput", "check_tool_images", "image_data_url"]

_MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool's result with images: `text` (what the model reads after the images) and `images` (PNG, JPEG, GIF,
    WebP or BMP bytes, or image references; see the module docstring). The images come before the text in the
    tool message, as a vision-language chat template shows them."""

    text: str = ""
    images: Sequence[str | bytes] = ()

    def __post_init__(self) -> None:
        # a list or a generator becomes a fixed value; a lone image (a str is a Sequence too) is one image
        lone = isinstance(self.images, (str, bytes, bytearray))
        object.__setattr__(self, "images", (self.images,) if lone else tuple(self.images))


class ImageLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What the tool runner accepts from one call: at most `max_images` images, each at most `max_image_bytes`
    bytes (the decoded file, not its data URL) and `max_image_pixels` pixels (width times height), and at most
    `max_total_pixels` pixels in all."""

    max_images: int = 8
    max_image_bytes: int = 8 * _MIB
    max_image_pixels: int = 4096 * 4096
    max_total_pixels: int = 2 * 4096 * 4096

    def __post_init__(self) -> None:
        for name in ("max_images", "max_image_bytes", "max_image_pixels", "max_total_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"ImageLimits.{name} must be at least 1, got {getattr(self, name)}")


DEFAULT_IMAGE_LIMITS: Final = ImageLimits()


def image_data_url(data: bytes) -> str:
    """`data` (a PNG, JPEG, GIF, WebP or BMP file) as a ``data:image/<type>;base64,`` URL, the type read from its
    header (`agent_protocol.image_format.read_header`). ValueError when it is none of these."""
    kind = read_header(data).format
    return f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"


def check_tool_images(images: Sequence[object], limits: ImageLimits = DEFAULT_IMAGE_LIMITS) -> tuple[str, ...]:
    """The references an observation carries for a tool's `images` (bytes as data URLs, references as given),
    or ValueError naming the first image that breaks a rule (``images[k]``) and what is wrong with it."""
    if len(images) > limits.max_images:
        raise ValueError(f"the tool returned {len(images)} images; at most {limits.max_images} are shown per call")
    read = [_read(f"images[{k}]", image, limits) for k, image in enumerate(images)]
    pixels = 0
    for k, (_, _, (width, height)) in enumerate(read):
        pixels += width * height
        if pixels > limits.max_total_pixels:
            raise ValueError(
                f"the images up to images[{k}] hold {pixels} pixels; the limit is {limits.max_total_pixels} pixels "
                "per call"
            )
    for k, (_, data, _) in enumerate(read):  # each decoded, one at a time, once every size is known to fit
        try:
            checked_size(data, max_pixels=limits.max_image_pixels)
        except ValueError as e:
            raise ValueError(f"images[{k}]: {e}") from e
    return tuple(image if isinstance(image, str) else image_data_url(data) for image, data, _ in read)


def _read(where: str, image: object, limits: ImageLimits) -> tuple[object, bytes, tuple[int, int]]:
    """`image`, its bytes and its size from its frame headers, or ValueError naming `where`."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
    elif isinstance(image, str):
        try:
            if not image.startswith("data:"):  # a data URL is checked as `read_image` decodes it, once
                check_image_url(image)
                _check_bytes(where, _file_size(image), limits)  # before reading: a huge file is never loaded
            data = read_image(image)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
    else:
        raise ValueError(
            f"{where} is of type {type(image).__name__}; an image is the bytes of a PNG, JPEG, GIF, WebP or BMP file, "
            "or a data:image URL, a file:// URL or a path"
        )
    _check_bytes(where, len(data), limits)
    try:
        width, height = image_size(data)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    if width * height > limits.max_image_pixels:
        raise ValueError(
            f"{where} is {width}x{height} = {width * height} pixels; the limit is {limits.max_image_pixels} pixels"
        )
    return image, data, (width, height)


def _check_bytes(where: str, size: int, limits: ImageLimits) -> None:
    if size > limits.max_image_bytes:
        raise ValueError(f"{where} is {size} bytes; the limit is {limits.max_image_bytes} bytes")


def _file_size(url: str) -> int:
    """The size of the file a ``file://`` URL or a path names (0 where it cannot be found: `read_image` then
    says why)."""
    path = Path(unquote(urlparse(url).path) if url.lower().startswith("file:") else url)
    try:
        return path.stat().st_size
    except OSError:
        return 0
