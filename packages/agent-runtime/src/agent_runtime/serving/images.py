"""Images over HTTP: which images a chat completion may carry, and how images the tools made go back to a client.

In: a request's messages may hold OpenAI ``image_url`` parts when the served model takes images: its chat protocol
is a vision-language one (`ChatProtocol.accepts_images`), its tokenizer knows the image grid (`vision`), and its
engine passes images on (`LLMEngine.accepts_images`). `check_request_images` walks the request's raw messages,
before they are converted or tokenized, and refuses with a 400 naming ``messages[i].content[k]``:

- any image, when the model is text-only (the message says which of the three is missing);
- anything but an inline ``data:image/<type>;base64,`` URL. Remote ``http(s)`` URLs are not fetched (the server
  would make requests on a client's behalf), and ``file://`` URLs and paths are never read: over HTTP they would
  let any client read the server's files. (In-process, `agent_runtime`'s Python API takes both.);
- a data URL that does not decode to a PNG, JPEG, GIF, WebP or BMP image (a wrong type, broken base64, a cut
  header, frames that do not fit the image's size, two JPEG frame headers), an image the model's image grid cannot
  take (an aspect ratio over 200), an image over `ServeConfig.max_image_bytes` decoded or over `max_image_pixels`;
- an image that passes all that and still does not decode: each is decoded (`agent_env.image_decoder`, when
  Pillow is installed), one at a time and within `max_image_pixels` at 4 bytes a pixel, after every size is
  checked, and at most `CONCURRENT_DECODES` in the whole process at once (requests are checked on worker threads
  before they take a slot: without the gate, every worker could hold an image at the budget). So a truncated
  body, a corrupt bitstream or a size the decoder reads otherwise is a 400 here (`invalid_image`), not an
  engine's 500 later, and a file whose decoding takes more memory than its pixels (a WebP, a progressive JPEG) is
  refused at fewer pixels (`image_too_large`);

and with a 400 naming ``messages``: more images in the request than `image_count_limit` allows (the recipe's
`max_images`, at most the server's; counted before any is decoded), more pixels in all than
`max_request_pixels`, or images whose pads alone (`VisionGrid.pads`) would fill the context.

Out: `client_image_parts` turns the images a tool returned (`Observation.images`: data URLs, or paths of files the
server's own tools wrote) into ``image_url`` parts holding data URLs, which any client can show.

This module knows image references, the serving limits and the error wire format; nothing about tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import structlog

from agent_env import ImageTooLarge, checked_size, image_data_url
from agent_protocol import (
    ChatProtocol,
    Tokenizer,
    VisionGrid,
    data_url_payload,
    decode_base64,
    image_grid,
    image_size,
    read_image,
)
from agent_runtime.engines.base import LLMEngine
from agent_runtime.serving.api_error import ApiError

__all__ = [
    "CONCURRENT_DECODES",
    "check_request_images",
    "client_image_parts",
    "image_count_limit",
    "image_url_part",
    "text_only_reason",
]

logger = structlog.get_logger(__name__)

CONCURRENT_DECODES: Final = 2  # images the server decodes at once, all requests together
_DECODING: Final = threading.BoundedSemaphore(CONCURRENT_DECODES)


def text_only_reason(protocol: ChatProtocol, tokenizer: Tokenizer, engine: LLMEngine) -> str | None:
    """Why the served model takes no images (None when it takes them)."""
    if not protocol.accepts_images:
        return f"its chat protocol ({protocol.name}) renders no images; serve a vision-language recipe (qwen3-vl)"
    if image_grid(tokenizer) is None:
        return (
            "its tokenizer has no image processor (a Qwen2-VL-style preprocessor_config.json beside "
            "tokenizer.json); serve a vision-language model"
        )
    if not engine.accepts_images:
        return f"its engine ({engine.name}) passes no images to the model"
    return None


def image_count_limit(recipe_max_images: int | None, server_max_images: int) -> int:
    """The most images one request may hold: the recipe's `max_images` where it sets one, never more than the
    server's (`ServeConfig.max_images`)."""
    return server_max_images if recipe_max_images is None else min(recipe_max_images, server_max_images)


def check_request_images(
    messages: Sequence[Any],
    *,
    text_only: str | None,
    grid: VisionGrid | None,
    max_image_bytes: int,
    max_image_pixels: int,
    max_request_pixels: int | None = None,
    max_images: int | None,
    context_tokens: int,
) -> int:
    """Check every ``image_url`` part of the request's raw `messages` (see the module docstring); the number of
    images. Raises `ApiError` 400. `grid`: the model's image grid (each image must have a size it takes, and its
    pads count against `context_tokens`). Parts that are not even shaped like an image part are left to
    `agent_protocol.coerce_messages`, which names them the same way. Decodes every image (with Pillow, when
    installed): call it off the event loop."""
    images = list(_image_urls(messages))
    if images and text_only is not None:
        where = images[0][0]
        raise ApiError(
            400,
            f"`{where}` holds an image, and the served model is text-only: {text_only}",
            param=where,
            code="images_not_supported",
        )
    if max_images is not None and len(images) > max_images:
        raise ApiError(
            400,
            f"the conversation holds {len(images)} images; the model takes at most {max_images} in one "
            "conversation (the recipe's max_images, or the server's --max-images)",
            param="messages",
            code="too_many_images",
        )
    pads = pixels = 0
    read: list[tuple[str, bytes]] = []
    for where, url in images:  # sizes and limits first, from the frame headers: nothing decoded yet
        data, (width, height) = _check_url(
            url, where, grid=grid, max_image_bytes=max_image_bytes, max_image_pixels=max_image_pixels
        )
        read.append((where, data))
        pixels += width * height
        if max_request_pixels is not None and pixels > max_request_pixels:
            raise ApiError(
                400,
                f"the images up to `{where}` hold {pixels} pixels; this server takes at most {max_request_pixels} "
                "in one request (ServeConfig.max_request_pixels)",
                param="messages",
                code="too_many_image_pixels",
            )
        pads += grid.pads(width, height) if grid is not None else 0
        if pads > context_tokens:
            raise ApiError(
                400,
                f"the images up to `{where}` alone take {pads} tokens; the model's context holds {context_tokens}",
                param="messages",
                code="context_length_exceeded",
            )
    for where, data in read:  # then each image decoded, one at a time, within the per-image budget
        try:
            with _DECODING:  # at most CONCURRENT_DECODES images in the process are decoded at once
                checked_size(data, max_pixels=max_image_pixels)
        except ImageTooLarge as e:  # a file that takes more memory to decode than its pixels (WebP, progressive JPEG)
            raise _refuse(where, f"{e} (ServeConfig.max_image_pixels)", "image_too_large") from e
        except ValueError as e:
            raise _refuse(where, f"the image cannot be read: {e}", "invalid_image") from e
    return len(images)


def _image_urls(messages: Sequence[Any]) -> Iterable[tuple[str, str]]:
    """(``messages[i].content[k]``, url) of each image part whose url is a string."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "image_url":
                continue
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
            if isinstance(url, str):
                yield f"messages[{i}].content[{k}]", url


def _refuse(where: str, problem: str, code: str) -> ApiError:
    return ApiError(400, f"invalid value for `{where}`: {problem}", param=where, code=code)


def _check_url(
    url: str, where: str, *, grid: VisionGrid | None, max_image_bytes: int, max_image_pixels: int
) -> tuple[bytes, tuple[int, int]]:
    """The image's bytes and (width, height), from its frame headers, if the server takes it, else the 400 naming
    `where`. The byte size is checked from the payload's length before anything is decoded."""
    if not url.startswith("data:"):
        if url[:8].lower().startswith(("http://", "https://")):
            problem = "remote image URLs are not fetched by this server; send the image inline as a data URL"
        else:
            problem = (
                "this server reads no files for its clients (file:// URLs and paths are refused); send the image "
                "inline as a data URL"
            )
        raise _refuse(where, f"{problem} (data:image/png;base64,...)", "unsupported_image_url")
    try:
        payload = data_url_payload(url)
    except ValueError as e:
        raise _refuse(where, str(e), "invalid_image") from e
    if len(payload) * 3 // 4 > max_image_bytes:
        raise _refuse(
            where,
            f"the image is about {len(payload) * 3 // 4} bytes; this server takes images of at most "
            f"{max_image_bytes} bytes (ServeConfig.max_image_bytes)",
            "image_too_large",
        )
    try:
        data = decode_base64(payload)
    except ValueError as e:
        raise _refuse(where, str(e), "invalid_image") from e
    try:
        width, height = image_size(data)
        if grid is not None:
            grid.smart_resize(height, width)
    except ValueError as e:
        raise _refuse(where, f"the image cannot be read: {e}", "invalid_image") from e
    if width * height > max_image_pixels:
        raise _refuse(
            where,
            f"the image is {width}x{height} pixels; this server takes images of at most {max_image_pixels} pixels "
            "(ServeConfig.max_image_pixels)",
            "image_too_large",
        )
    return data, (width, height)


def image_url_part(url: str) -> dict[str, Any]:
    """One OpenAI ``image_url`` content part."""
    return {"type": "image_url", "image_url": {"url": url}}


def client_image_parts(images: Iterable[str]) -> list[dict[str, Any]]:
    """The images a tool returned (`Observation.images`: data URLs, checked by the tool runner, or paths and
    ``file://`` URLs of files the server's own tools wrote) as ``image_url`` parts holding data URLs. A file that
    cannot be read any more is logged and left out. Reads files: call it off the event loop."""
    parts: list[dict[str, Any]] = []
    for url in images:
        try:
            parts.append(image_url_part(url if url.startswith("data:") else image_data_url(read_image(url))))
        except ValueError as e:
            logger.warning("tool_image_unreadable", error=str(e)[:300])
    return parts
