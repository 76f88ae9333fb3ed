"""Images in messages: what an image reference may be, the size an image has, and how many placeholder tokens a
Qwen2-VL-style vision encoder gives it.

An image travels as the reference the client wrote (OpenAI's ``image_url.url``): a ``data:image/...;base64,`` URL,
a ``file://`` URL or a local path. `check_image_url` accepts or refuses one (a refusal is a `ValueError` whose
message says what is wrong; `types` names the message and part). Remote ``http(s)`` URLs are refused: fetching
them is a network and trust decision this layer does not make. Size limits are the serving layer's job.

Token-in-token-out with images follows OpenRLHF's VLM path (`openrlhf.utils.vlm_utils`): the chat template writes
one ``<|image_pad|>`` per image; the model's processor expands it into N pads (N from the image's size, see
`VisionGrid`), and that expanded sequence is what training sees; an engine such as vLLM takes the sequence with
each run of pads collapsed to one (`collapse_image_pads`, as `dedup_media_tokens` does) and expands it itself.
`expand_image_pads` turns the first form into the second and records where each image's run sits.

Whether a model takes images is declared, not guessed: a tokenizer that knows its model's image processor is
`SeesImages` (its `vision` is the `VisionGrid`, None for a text-only model; `HFTokenizer` and
`TransformersTokenizer` declare it), and `image_grid` reads that declaration for the conversation, the engines and
the server alike.

Pure Python (no PIL): `image_size` reads width and height from the PNG, JPEG, GIF, WebP or BMP structure, every
frame checked against them (`agent_protocol.image_format`). This module knows no chat format and no tokenizer.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

import msgspec

from agent_protocol.image_format import read_header

__all__ = [
    "ImageSpan",
    "SeesImages",
    "VisionGrid",
    "check_image_url",
    "collapse_image_pads",
    "data_url_payload",
    "decode_base64",
    "expand_image_pads",
    "image_grid",
    "image_size",
    "image_spans",
    "read_image",
]


class ImageSpan(msgspec.Struct, frozen=True, kw_only=True):
    """Where one image's placeholder tokens sit in a token sequence: ``ids[start:end]`` are its pads (as many as
    the model's processor gives it), `source` the image as the message referred to it."""

    start: int
    end: int
    source: str


def check_image_url(url: Any) -> str:
    """`url` if it is an image reference this layer accepts, else ValueError saying why. A data URL must declare
    an image type and hold base64 that decodes to an image (PNG, JPEG, GIF, WebP or BMP); a ``file://`` URL or
    a path must name a file (whether it exists is checked where the image is read)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"image_url.url must be a non-empty string, got {type(url).__name__}")
    if url.startswith("data:"):
        _data_url_bytes(url)
        return url
    scheme = urlparse(url).scheme.lower()
    if scheme == "file":
        if not _file_path(url):
            raise ValueError("a file:// image URL must name a file")
        return url
    if scheme in ("http", "https", "ftp"):
        raise ValueError(f"{scheme} image URLs are not fetched; send the image as a data URL or a local path")
    if len(scheme) > 1:  # "c:" in a Windows path is a drive, not a scheme
        raise ValueError(f"unsupported image URL scheme {scheme!r}; use a data:image/... URL, file:// or a path")
    return url


def read_image(url: str) -> bytes:
    """The bytes of the image `url` refers to (a data URL is decoded, a file read). Raises ValueError when it
    cannot be read or is not an image of a known format."""
    if url.startswith("data:"):
        return _data_url_bytes(url)
    path = Path(_file_path(url) if url.lower().startswith("file:") else url)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"image file {str(path)!r} cannot be read: {e.strerror or e}") from e
    image_size(data)
    return data


def _file_path(url: str) -> str:
    return unquote(urlparse(url).path)


def data_url_payload(url: str) -> str:
    """The base64 payload of an image data URL (``data:image/<type>;base64,<data>``), its whitespace removed, once
    its header is checked; ValueError saying what is wrong. String operations only, no regular expression, so a
    hostile URL of megabytes costs milliseconds (serving checks clients' images with it before decoding them)."""
    comma = url.find(",")
    if not url.startswith("data:") or comma < 0:
        raise ValueError("not a data URL (expected data:image/<type>;base64,<data>)")
    mime, *params = url[len("data:") : comma].split(";")
    mime = mime.strip().lower()
    if not mime.startswith("image/"):
        raise ValueError(f"a data URL of type {mime[:40] or 'text/plain'!r} is not an image")
    if "base64" not in [p.strip().lower() for p in params]:
        raise ValueError("an image data URL must be base64-encoded (data:image/<type>;base64,...)")
    return "".join(url[comma + 1 :].split())


def decode_base64(payload: str) -> bytes:
    """`payload` (from `data_url_payload`) decoded; ValueError when it is not base64."""
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"the data URL's base64 cannot be decoded ({e})") from e


def _data_url_bytes(url: str) -> bytes:
    data = decode_base64(data_url_payload(url))
    image_size(data)
    return data


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, JPEG, GIF, WebP or BMP image, as PIL reports `Image.size` (no EXIF rotation:
    OpenRLHF's loader applies none), read from its structure over every frame (`image_format.read_header`).
    ValueError for anything else, a truncated header, or frames that do not fit that size."""
    header = read_header(data)
    return header.width, header.height


class VisionGrid(msgspec.Struct, frozen=True, kw_only=True):
    """How a Qwen2-VL-style image processor cuts an image into tokens: resized (`smart_resize`) to sides that
    are multiples of ``patch_size * merge_size`` with a pixel count within [`min_pixels`, `max_pixels`], cut into
    ``patch_size`` patches, and every ``merge_size x merge_size`` patches merged into one token. The defaults are
    transformers' `Qwen2VLImageProcessor` defaults (Qwen2-VL, Qwen2.5-VL); a model directory's
    ``preprocessor_config.json`` gives its own (`from_preprocessor_config`; Qwen3-VL uses patch 16)."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> VisionGrid:
        """The grid a ``preprocessor_config.json`` describes: ``size.shortest_edge`` / ``size.longest_edge``
        (transformers 4.5x+) or the older ``min_pixels`` / ``max_pixels`` keys, which win when both are given, as
        in the image processor."""
        size = config.get("size") or {}
        default = cls()
        return cls(
            patch_size=int(config.get("patch_size", default.patch_size)),
            merge_size=int(config.get("merge_size", default.merge_size)),
            min_pixels=int(config.get("min_pixels") or size.get("shortest_edge") or default.min_pixels),
            max_pixels=int(config.get("max_pixels") or size.get("longest_edge") or default.max_pixels),
        )

    def smart_resize(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the image is resized to, by the rule of Qwen2-VL's `smart_resize`: sides rounded to
        multiples of the factor, then scaled down (floor) above `max_pixels` or up (ceil) below `min_pixels`,
        keeping the aspect ratio. ValueError for an aspect ratio beyond 200, which the processor refuses."""
        if height <= 0 or width <= 0:
            raise ValueError(f"an image must have a positive size, got {width}x{height}")
        if max(height, width) / min(height, width) > 200:
            raise ValueError(f"an image's aspect ratio must be at most 200, got {width}x{height}")
        factor = self.patch_size * self.merge_size
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        """(t, h, w) patches of one image: the processor's ``image_grid_thw`` row (an image is one frame)."""
        h_bar, w_bar = self.smart_resize(height, width)
        return 1, h_bar // self.patch_size, w_bar // self.patch_size

    def pads(self, width: int, height: int) -> int:
        """How many ``<|image_pad|>`` tokens an image of this size stands for: its patches over ``merge_size**2``."""
        t, h, w = self.grid(width, height)
        return t * h * w // self.merge_size**2

    def pads_for(self, url: str) -> int:
        """`pads` for the image `url` refers to (read with `read_image`)."""
        width, height = image_size(read_image(url))
        return self.pads(width, height)


@runtime_checkable
class SeesImages(Protocol):
    """A tokenizer that declares its model's image processor: `vision` is how it cuts an image into pad tokens,
    None when the model is text-only."""

    @property
    def vision(self) -> VisionGrid | None: ...


def image_grid(tokenizer: object) -> VisionGrid | None:
    """The image grid `tokenizer` declares (`SeesImages`); None for a text-only model or a tokenizer that
    declares nothing (a test's fake, say)."""
    return tokenizer.vision if isinstance(tokenizer, SeesImages) else None


def expand_image_pads(
    ids: Sequence[int], *, pad_id: int, pads: Sequence[int], sources: Sequence[str]
) -> tuple[list[int], list[ImageSpan]]:
    """`ids` (a tokenized render with one `pad_id` per image, in order) with the k-th pad repeated ``pads[k]`` times,
    as the model's processor expands them, and the span of each image's run (`sources[k]` its reference). Raises
    ValueError when the number of pads in `ids` is not the number of images."""
    if len(pads) != len(sources):
        raise ValueError(f"got {len(pads)} pad counts for {len(sources)} images")
    found = sum(1 for i in ids if i == pad_id)
    if found != len(pads):
        raise ValueError(f"the text holds {found} image placeholders for {len(pads)} images")
    out: list[int] = []
    spans: list[ImageSpan] = []
    k = 0
    for token in ids:
        if token != pad_id:
            out.append(token)
            continue
        if pads[k] < 1:
            raise ValueError(f"image {k} must stand for at least one pad token, got {pads[k]}")
        spans.append(ImageSpan(start=len(out), end=len(out) + pads[k], source=sources[k]))
        out.extend([pad_id] * pads[k])
        k += 1
    return out, spans


def image_spans(ids: Sequence[int], *, pad_id: int, sources: Sequence[str]) -> list[ImageSpan]:
    """The span of each image's run of `pad_id` in `ids` (already expanded), the k-th run being `sources[k]`'s.
    Raises ValueError when the runs are not one per image: a pad the text wrote without an image, say."""
    spans: list[ImageSpan] = []
    start = None
    for at, token in enumerate([*ids, None]):
        if token == pad_id:
            start = at if start is None else start
        elif start is not None:
            if len(spans) == len(sources):
                raise ValueError(f"the ids hold more image placeholders than the {len(sources)} images")
            spans.append(ImageSpan(start=start, end=at, source=sources[len(spans)]))
            start = None
    if len(spans) != len(sources):
        raise ValueError(f"the ids hold {len(spans)} image placeholders for {len(sources)} images")
    return spans


def collapse_image_pads(ids: Sequence[int], pad_ids: set[int] | frozenset[int]) -> list[int]:
    """`ids` with each run of consecutive pad tokens collapsed to one: the prompt an engine that expands images
    itself takes (vLLM), as OpenRLHF's `dedup_media_tokens` gives it."""
    out: list[int] = []
    for token in ids:
        if token in pad_ids and out and out[-1] in pad_ids:
            continue
        out.append(token)
    return out
