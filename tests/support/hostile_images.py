"""Hostile images, made here from Pillow's own output and a few bytes patched: frame headers that say fewer pixels
than the frames hold, two JPEG frame headers, PNGs whose IHDR claims more than their data holds, decompression
bombs at and over a pixel budget, animated GIF/APNG/WebP with a frame outside the canvas, truncated and corrupt
bodies, palette tricks, formats the server does not take, and a seeded fuzz of byte flips and cuts.

`hostile_images(budget)` gives each case by name as (bytes, the outcome expected: ``"ok"``, ``"invalid_image"`` or
``"image_too_large"``) for a server or tool runner whose per-image pixel limit is `budget`. `fuzzed_images` gives
mutants of valid images whose outcome is not fixed in advance (only: never a server error). Needs Pillow.
"""

from __future__ import annotations

import io
import math
import random
import struct
import zlib
from collections.abc import Callable
from typing import Any

from PIL import Image

__all__ = ["fuzzed_images", "hostile_images", "pillow_bytes", "png_chunks"]


def pillow_bytes(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = random.Random(seed)
    channels = len(mode)
    return Image.frombytes(mode, (width, height), rng.randbytes(width * height * channels))


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, body) of each chunk of a PNG."""
    chunks, at = [], 8
    while at + 8 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        chunks.append((data[at + 4 : at + 8], data[at + 8 : at + 8 + length]))
        at += 12 + length
    return chunks


def png_of(chunks: list[tuple[bytes, bytes]]) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunk(kind, body) for kind, body in chunks)


def ihdr(width: int, height: int, color_type: int = 2, depth: int = 8) -> tuple[bytes, bytes]:
    return b"IHDR", struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)


def zero_png(width: int, height: int) -> bytes:
    """A black RGB PNG of this size: a decompression bomb (a few kilobytes per megapixel)."""
    row = b"\x00" * (1 + 3 * width)
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    return png_of([ihdr(width, height), (b"IDAT", body), (b"IEND", b"")])


def gif_with_screen(frame: Image.Image, screen: tuple[int, int]) -> bytes:
    """A GIF of `frame` whose logical screen says `screen`."""
    data = bytearray(pillow_bytes(frame.convert("P"), "GIF"))
    data[6:10] = struct.pack("<HH", *screen)
    return bytes(data)


def animated_gif(frames: int = 3, size: tuple[int, int] = (64, 48)) -> bytes:
    images = [noise(*size, seed=k).convert("P") for k in range(frames)]
    return pillow_bytes(images[0], "GIF", save_all=True, append_images=images[1:], duration=50, loop=0)


def gif_frame_outside(size: tuple[int, int] = (64, 48)) -> bytes:
    """An animated GIF whose second frame descriptor claims 5000 pixels wide."""
    data = bytearray(animated_gif(2, size))
    second = data.find(b"\x2c", data.find(b"\x2c", 13) + 10)  # the second image descriptor (after a GCE)
    while data[second + 5 : second + 7] != struct.pack("<H", size[0]):
        second = data.find(b"\x2c", second + 1)
    data[second + 5 : second + 7] = struct.pack("<H", 5000)
    return bytes(data)


def jpeg_segments(data: bytes) -> int:
    """The offset of the first SOF segment of a JPEG."""
    at = 2
    while data[at + 1] not in (0xC0, 0xC2):
        at += 2 + struct.unpack(">H", data[at + 2 : at + 4])[0]
    return at


def jpeg_two_sof(after_scan: bool = False) -> bytes:
    """A 64x48 JPEG with a second frame header (7000x7000) before its scan, or after it."""
    data = pillow_bytes(noise(64, 48), "JPEG")
    at = jpeg_segments(data)
    length = struct.unpack(">H", data[at + 2 : at + 4])[0]
    sof = bytearray(data[at : at + 2 + length])
    sof[5:9] = struct.pack(">HH", 7000, 7000)
    if after_scan:
        return data[:-2] + bytes(sof) + data[-2:]
    return data[: at + 2 + length] + bytes(sof) + data[at + 2 + length :]


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR says `width` x `height` and whose data is an 8x8 image's."""
    small = png_chunks(pillow_bytes(noise(8, 8), "PNG"))
    return png_of([ihdr(width, height), *[c for c in small if c[0] != b"IHDR"]])


def apng(frames: int = 2, size: tuple[int, int] = (40, 30)) -> bytes:
    images = [noise(*size, seed=k) for k in range(frames)]
    return pillow_bytes(images[0], "PNG", save_all=True, append_images=images[1:], duration=50)


def apng_frame_outside() -> bytes:
    """An APNG whose second frame control (fcTL) says 6000x6000."""
    chunks = png_chunks(apng())
    controls = [k for k, (kind, _) in enumerate(chunks) if kind == b"fcTL"]
    kind, body = chunks[controls[1]]
    chunks[controls[1]] = (kind, body[:4] + struct.pack(">II", 6000, 6000) + body[12:])
    return png_of(chunks)


def webp_animated(canvas: tuple[int, int] | None = None) -> bytes:
    """An animated WebP (40x30); with `canvas`, its VP8X canvas patched to that size."""
    images = [noise(40, 30, seed=k) for k in range(2)]
    data = bytearray(pillow_bytes(images[0], "WEBP", save_all=True, append_images=images[1:], duration=50))
    if canvas is not None:
        assert data[12:16] == b"VP8X"
        data[24:27] = (canvas[0] - 1).to_bytes(3, "little")
        data[27:30] = (canvas[1] - 1).to_bytes(3, "little")
    return bytes(data)


def bmp_claiming(width: int, height: int) -> bytes:
    """A BMP whose header says `width` x `height` with 100 bytes of pixels."""
    data = bytearray(pillow_bytes(noise(8, 8), "BMP")[:54] + b"\x7f" * 100)
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def corrupt_idat() -> bytes:
    chunks = png_chunks(pillow_bytes(noise(64, 64), "PNG"))
    return png_of([(k, b"\x78\x9c" + b"\xff" * (len(b) - 2) if k == b"IDAT" else b) for k, b in chunks])


def palette_png(*, with_palette: bool, entries: int = 2) -> bytes:
    """A 32x32 palette PNG whose pixels use index 200: with a palette of `entries` colours, or none at all."""
    rows = b"".join(b"\x00" + bytes([200]) * 32 for _ in range(32))
    chunks = [ihdr(32, 32, color_type=3)]
    if with_palette:
        chunks.append((b"PLTE", bytes(range(3 * entries))))
    return png_of([*chunks, (b"IDAT", zlib.compress(rows)), (b"IEND", b"")])


def _cut(data: bytes, numerator: int, denominator: int) -> bytes:
    return data[: len(data) * numerator // denominator]


def hostile_images(budget: int) -> dict[str, tuple[bytes, str]]:
    """Each hostile case by name: (bytes, expected outcome) against a per-image limit of `budget` pixels."""
    side = math.isqrt(budget)  # a square at the budget
    half = math.isqrt(budget // 2)
    valid_png = pillow_bytes(noise(64, 48), "PNG")
    cases: dict[str, Callable[[], tuple[bytes, str]]] = {
        "gif: 1x1 screen holding a 7000x7000 frame": lambda: (
            gif_with_screen(Image.new("P", (7000, 7000)), (1, 1)),
            "invalid_image",
        ),
        "gif: a later frame outside the screen": lambda: (gif_frame_outside(), "invalid_image"),
        "gif: animated, 3 frames": lambda: (animated_gif(), "ok"),
        "gif: cut before its frame": lambda: (animated_gif(1, (200, 150))[:400], "invalid_image"),
        "gif: cut inside its frame's data": lambda: (_cut(animated_gif(1, (200, 150)), 2, 3), "invalid_image"),
        "jpeg: two frame headers (SOF) before the scan": lambda: (jpeg_two_sof(), "invalid_image"),
        "jpeg: a second frame header after the scan": lambda: (jpeg_two_sof(after_scan=True), "invalid_image"),
        "jpeg: truncated": lambda: (pillow_bytes(noise(200, 150), "JPEG")[:3000], "invalid_image"),
        "jpeg: CMYK": lambda: (pillow_bytes(noise(64, 48, "CMYK"), "JPEG"), "ok"),
        "png: IHDR claims the budget, data of 8x8": lambda: (png_claiming(side, side), "invalid_image"),
        "png: IHDR claims 100000x100000": lambda: (png_claiming(100_000, 100_000), "image_too_large"),
        "png: decompression bomb at the budget": lambda: (zero_png(side, side), "ok"),
        "png: decompression bomb over the budget": lambda: (zero_png(side + 1, side + 1), "image_too_large"),
        "png: truncated": lambda: (_cut(valid_png, 2, 3), "invalid_image"),
        "png: corrupt zlib data": lambda: (corrupt_idat(), "invalid_image"),
        "png: 16-bit grey": lambda: (pillow_bytes(noise(64, 48, "I;16"), "PNG"), "ok"),
        "png: palette indices beyond a 2-colour palette": lambda: (palette_png(with_palette=True), "ok"),
        "png: palette image without a palette (Pillow's default palette)": lambda: (
            palette_png(with_palette=False),
            "ok",
        ),
        "apng: 2 frames": lambda: (apng(), "ok"),
        "apng: a frame control of 6000x6000": lambda: (apng_frame_outside(), "invalid_image"),
        "webp: animated": lambda: (webp_animated(), "ok"),
        "webp: animated, canvas patched to 1x1": lambda: (webp_animated((1, 1)), "invalid_image"),
        "webp: lossless, flat, at the pixel budget (libwebp: 16 bytes a pixel)": lambda: (
            pillow_bytes(Image.new("RGB", (side, side), (9, 99, 199)), "WEBP", lossless=True),
            "image_too_large",
        ),
        "webp: lossless, flat, at a quarter of the budget": lambda: (
            pillow_bytes(Image.new("RGB", (side // 2, side // 2), (9, 99, 199)), "WEBP", lossless=True),
            "ok",
        ),
        "jpeg: progressive 4:4:4 at the budget (coefficients held whole)": lambda: (
            pillow_bytes(Image.new("RGB", (side, side), (9, 99, 199)), "JPEG", progressive=True, subsampling=0),
            "image_too_large",
        ),
        "jpeg: progressive 4:2:0 at half the budget": lambda: (
            pillow_bytes(Image.new("RGB", (half, half), (9, 99, 199)), "JPEG", progressive=True),
            "ok",
        ),
        "bmp: header claims the budget, 100 bytes of pixels": lambda: (bmp_claiming(side, side), "invalid_image"),
        "bmp: negative width": lambda: (bmp_claiming(-64, 48), "invalid_image"),
        "tiff (Pillow opens it; not taken)": lambda: (pillow_bytes(noise(64, 48), "TIFF"), "invalid_image"),
    }
    return {name: build() for name, build in cases.items()}


def fuzzed_images(count: int, seed: int = 0) -> list[bytes]:
    """`count` mutants of small valid PNG, JPEG, GIF, WebP and BMP images: bytes flipped, inserted or cut."""
    rng = random.Random(seed)
    picture = noise(48, 32)
    bases = [
        pillow_bytes(picture, "PNG"),
        pillow_bytes(picture, "JPEG"),
        pillow_bytes(picture, "JPEG", progressive=True),
        animated_gif(2, (48, 32)),
        pillow_bytes(picture, "WEBP"),
        pillow_bytes(picture, "BMP"),
        apng(2, (48, 32)),
    ]
    mutants = []
    for k in range(count):
        data = bytearray(bases[k % len(bases)])
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            action = rng.choice(["flip", "insert", "cut", "header"])
            if action == "flip":
                data[at] ^= 1 << rng.randrange(8)
            elif action == "insert":
                data[at:at] = rng.randbytes(rng.randint(1, 16))
            elif action == "cut":
                del data[at:]
                data += b"\0"  # never empty
            else:  # the first 40 bytes, where the sizes are
                data[rng.randrange(min(40, len(data)))] = rng.randrange(256)
        mutants.append(bytes(data))
    return mutants
