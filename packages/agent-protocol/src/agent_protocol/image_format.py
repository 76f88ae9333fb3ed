"""`read_header`: the format and size of a PNG, JPEG, GIF, WebP or BMP image, read from its structure over every
frame, in pure Python, as a decoder (Pillow, libjpeg, libwebp) will see it, and the memory decoding it takes.

A header alone is not enough: a decoder may produce more pixels than the first header says. A GIF's logical
screen of 1x1 can hold a 7000x7000 frame (Pillow then grows the image to the frame), a JPEG can carry two frame
(SOF) headers of different sizes (Pillow takes the last one), an APNG or animated WebP frame can reach outside
its canvas. So every frame header in the file is read, and an image whose frames disagree with its size is
refused (`ValueError`, saying which frame and why), never resized: the size returned is the one Pillow reports
for the image, and the one every frame fits in. Pixels are not decoded here (a truncated body, a corrupt
bitstream are the decoder's to find); the walk costs time linear in the file's bytes and no memory beyond it.

Decoding costs more than the pixels for some files, and `ImageHeader.decode_bytes` says how much, so that a budget
can be checked before a decoder runs: Pillow stores a pixel in at most 4 bytes (1 for a grey JPEG); libwebp holds
its canvas and Pillow's copy of it, about 16 bytes a pixel in all (measured: a 380-byte lossless WebP of 8
megapixels takes 122 MiB); a progressive or multi-scan JPEG keeps every DCT coefficient (2 bytes a sample) until
its last scan, on top of the output.

This module knows image file formats; nothing about URLs, limits or tokens.
"""

from __future__ import annotations

import struct
from typing import Final, Literal

import msgspec

__all__ = ["ImageFormat", "ImageHeader", "read_header"]

ImageFormat = Literal["png", "jpeg", "gif", "webp", "bmp"]


class ImageHeader(msgspec.Struct, frozen=True, kw_only=True):
    """What an image file says of itself, every frame checked: its `format`, its size (`width` x `height`, as
    Pillow reports it), and `decode_bytes`, about the most memory decoding its first frame takes (see the module
    docstring)."""

    format: ImageFormat
    width: int
    height: int
    decode_bytes: int


#: the bytes a decoder holds per pixel, beyond a JPEG's coefficients (Pillow's 4; libwebp's canvas besides)
_BYTES_PER_PIXEL: Final = {"png": 4, "gif": 4, "bmp": 4, "webp": 16}

_NOT_AN_IMAGE: Final = "the data is not a PNG, JPEG, GIF, WebP or BMP image (or its header is cut off)"


def read_header(data: bytes) -> ImageHeader:
    """The format, size and decoding cost of the image in `data`, every frame checked against that size.
    ValueError for anything else, a cut header, an empty size, or frames that do not fit the image (see the
    module docstring)."""
    kind: ImageFormat
    cost = 0
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        kind, (width, height) = "png", _png(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        kind, (width, height) = "gif", _gif(data)
    elif data[:2] == b"BM":
        kind, (width, height) = "bmp", _bmp(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        kind, (width, height) = "webp", _webp(data)
    elif data[:2] == b"\xff\xd8":
        kind, (width, height, cost) = "jpeg", _jpeg(data)
    else:
        raise ValueError(_NOT_AN_IMAGE)
    if width <= 0 or height <= 0:
        raise ValueError(f"the image header gives an empty size {width}x{height}")
    cost = cost or _BYTES_PER_PIXEL[kind] * width * height
    return ImageHeader(format=kind, width=width, height=height, decode_bytes=cost)


def _fits(kind: str, k: int, frame: tuple[int, int, int, int], canvas: tuple[int, int]) -> None:
    """ValueError unless frame `k` (left, top, width, height) lies inside `canvas` (width, height)."""
    left, top, width, height = frame
    if width <= 0 or height <= 0 or left + width > canvas[0] or top + height > canvas[1]:
        raise ValueError(
            f"{kind} frame {k} ({width}x{height} at {left},{top}) does not fit the image's {canvas[0]}x{canvas[1]} "
            "size: a decoder would make more pixels than the header says"
        )


def _png(data: bytes) -> tuple[int, int]:
    """IHDR's size; every APNG frame control (fcTL) must fit in it, as the APNG spec (and Pillow) require."""
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise ValueError(_NOT_AN_IMAGE)
    width, height = struct.unpack(">II", data[16:24])
    at, frame = 8, 0
    while at + 8 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        body = data[at + 8 : at + 8 + length]
        if kind == b"fcTL" and len(body) >= 20:
            w, h, x, y = struct.unpack(">IIII", body[4:20])
            _fits("APNG", frame, (x, y, w, h), (width, height))
            frame += 1
        if kind == b"IEND":
            break
        at += 12 + length
    return int(width), int(height)


def _gif(data: bytes) -> tuple[int, int]:
    """The logical screen's size; every image descriptor (frame) must lie inside it. Blocks are walked as Pillow
    walks them (an unknown byte between blocks is skipped); at least one frame must be there."""
    if len(data) < 13:
        raise ValueError(_NOT_AN_IMAGE)
    width, height, flags = struct.unpack("<HHB", data[6:11])
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    frames = 0
    while at < len(data):
        block = data[at]
        if block == 0x3B:  # trailer
            break
        if block == 0x21:  # extension: label, then sub-blocks
            at = _skip_sub_blocks(data, at + 2)
        elif block == 0x2C:  # image descriptor
            if at + 10 > len(data):
                break
            left, top, w, h, frame_flags = struct.unpack("<HHHHB", data[at + 1 : at + 10])
            _fits("GIF", frames, (left, top, w, h), (width, height))
            frames += 1
            at += 10 + (3 << ((frame_flags & 7) + 1) if frame_flags & 0x80 else 0)
            at = _skip_sub_blocks(data, at + 1)  # after the LZW minimum code size
        else:
            at += 1
    if not frames:
        raise ValueError("the GIF holds no frame (or its first frame header is cut off)")
    return int(width), int(height)


def _skip_sub_blocks(data: bytes, at: int) -> int:
    """The offset after the data sub-blocks starting at `at` (each a length byte and that many bytes, 0 ends)."""
    while at < len(data):
        size = data[at]
        at += 1 + size
        if size == 0:
            break
    return at


def _bmp(data: bytes) -> tuple[int, int]:
    """The DIB header's size: 16-bit fields in an OS/2 core header (12 bytes), signed 32-bit ones otherwise (a
    negative height is a top-down bitmap; a negative width is no bitmap)."""
    if len(data) < 26:
        raise ValueError(_NOT_AN_IMAGE)
    (header_size,) = struct.unpack("<I", data[14:18])
    if header_size == 12:
        width, height = struct.unpack("<HH", data[18:22])
        return int(width), int(height)
    width, height = struct.unpack("<ii", data[18:26])
    if width < 0:
        raise ValueError(f"the BMP header gives a negative width {width}")
    return int(width), abs(int(height))


def _webp(data: bytes) -> tuple[int, int]:
    """A simple file's bitstream size, or an extended file's (VP8X) canvas, which its still bitstream must equal
    and every animation frame (ANMF) must fit in."""
    chunks = list(_riff_chunks(data))
    if not chunks:
        raise ValueError(_NOT_AN_IMAGE)
    kind, body = chunks[0]
    if kind != b"VP8X":
        size = _bitstream_size(kind, body)
        if size is None:
            raise ValueError(_NOT_AN_IMAGE)
        return size
    if len(body) < 10:
        raise ValueError(_NOT_AN_IMAGE)
    canvas = int.from_bytes(body[4:7], "little") + 1, int.from_bytes(body[7:10], "little") + 1
    frame = 0
    for kind, body in chunks[1:]:
        if kind == b"ANMF" and len(body) >= 16:
            x, y = 2 * int.from_bytes(body[0:3], "little"), 2 * int.from_bytes(body[3:6], "little")
            w, h = int.from_bytes(body[6:9], "little") + 1, int.from_bytes(body[9:12], "little") + 1
            _fits("WebP", frame, (x, y, w, h), canvas)
            frame += 1
        size = _bitstream_size(kind, body)
        if size is not None and size != canvas:
            raise ValueError(
                f"the WebP bitstream is {size[0]}x{size[1]}, its canvas {canvas[0]}x{canvas[1]}: a decoder would "
                "not make the pixels the header says"
            )
    return canvas


def _riff_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, at = [], 12
    while at + 8 <= len(data):
        (length,) = struct.unpack("<I", data[at + 4 : at + 8])
        chunks.append((data[at : at + 4], data[at + 8 : at + 8 + length]))
        at += 8 + length + (length & 1)
    return chunks


def _bitstream_size(kind: bytes, body: bytes) -> tuple[int, int] | None:
    """The size a VP8 (lossy) or VP8L (lossless) bitstream gives, None for any other chunk or a cut one."""
    if kind == b"VP8 " and len(body) >= 10:
        w, h = struct.unpack("<HH", body[6:10])
        return int(w) & 0x3FFF, int(h) & 0x3FFF
    if kind == b"VP8L" and len(body) >= 5:
        bits = int.from_bytes(body[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


#: JPEG start-of-frame markers (baseline, progressive, lossless, ...), which carry the frame size
_SOF: Final = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(data: bytes) -> tuple[int, int, int]:
    """The size of the one frame header (SOF) and the bytes decoding it takes. Every marker segment is walked,
    the entropy-coded data after each scan (SOS) skipped to the next marker: a second SOF anywhere is refused
    (Pillow would take the last one before the first scan, libjpeg refuses one after it)."""
    sizes: list[tuple[int, int]] = []
    frame = b""
    progressive = False
    scans = 0
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise ValueError(f"the JPEG has no marker at byte {at}: its segments are corrupt")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xD9:  # end of image
            break
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _SOF:
            if at + 9 > len(data):
                break
            h, w = struct.unpack(">HH", data[at + 5 : at + 9])
            sizes.append((int(w), int(h)))
            frame = data[at + 4 : at + 2 + int(length)]
            progressive = marker in (0xC2, 0xC6, 0xCA, 0xCE)
        at += 2 + int(length)
        if marker == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            scans += 1
            at = _after_entropy_data(data, at)
    if not sizes:
        raise ValueError(_NOT_AN_IMAGE)
    if len(sizes) > 1:
        described = ", ".join(f"{w}x{h}" for w, h in sizes[:4])
        raise ValueError(f"the JPEG holds {len(sizes)} frame headers (SOF markers: {described}); an image has one")
    width, height = sizes[0]
    return width, height, _jpeg_cost(frame, width, height, buffered=progressive or scans > 1)


def _jpeg_cost(frame: bytes, width: int, height: int, *, buffered: bool) -> int:
    """The bytes decoding a JPEG takes: Pillow's output (1 byte a pixel for one component, else 4) and, for a
    progressive or multi-scan file, libjpeg's whole-image coefficient buffer (2 bytes a sample, each component
    at its sampling factors, padded to 8x8 blocks). `frame`: the SOF segment after its length."""
    components = frame[5] if len(frame) > 5 else 3
    cost = width * height * (1 if components == 1 else 4)
    factors = [(frame[7 + 3 * c] >> 4, frame[7 + 3 * c] & 15) for c in range(components) if 8 + 3 * c <= len(frame)]
    if not buffered or not factors:
        return cost
    h_max, v_max = max(max(h for h, _ in factors), 1), max(max(v for _, v in factors), 1)
    for h, v in factors:
        columns = -(-width * max(h, 1) // h_max)
        rows = -(-height * max(v, 1) // v_max)
        cost += 2 * (-(-columns // 8) * 8) * (-(-rows // 8) * 8)
    return cost


def _after_entropy_data(data: bytes, at: int) -> int:
    """The offset of the first marker at or after `at` that is not a stuffed 0xFF00 or a restart marker."""
    while True:
        at = data.find(b"\xff", at)
        if at < 0 or at + 1 >= len(data):
            return len(data)
        following = data[at + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7 or following == 0xFF:
            at += 1 if following == 0xFF else 2
            continue
        return at
