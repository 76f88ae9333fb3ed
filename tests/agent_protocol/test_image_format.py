"""`read_header` against Pillow: the size it reads over every frame is the size Pillow opens the image at, and an
image whose frames do not fit its header (a GIF screen of 1x1 holding a 7000x7000 frame, two JPEG frame headers,
an APNG or WebP frame outside its canvas) is refused saying which frame; a seeded fuzz of byte flips and cuts
never gets another exception, nor a size Pillow disagrees with. Skipped without Pillow (agent-protocol's lone run)."""

from __future__ import annotations

import io
import struct

import pytest

from agent_protocol.image_format import read_header

pytest.importorskip("PIL")

from PIL import Image

from tests.support.hostile_images import fuzzed_images, hostile_images, noise, pillow_bytes

PIL_FORMAT = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP", "bmp": "BMP"}
BUDGET = 1_000_000

REFUSED_BY_STRUCTURE = {
    "gif: 1x1 screen holding a 7000x7000 frame": "GIF frame 0 (7000x7000 at 0,0) does not fit the image's 1x1 size",
    "gif: a later frame outside the screen": "GIF frame 1 (5000x48 at 0,0) does not fit the image's 64x48 size",
    "gif: cut before its frame": "the GIF holds no frame",
    "jpeg: two frame headers (SOF) before the scan": "2 frame headers (SOF markers: 64x48, 7000x7000)",
    "jpeg: a second frame header after the scan": "2 frame headers (SOF markers: 64x48, 7000x7000)",
    "apng: a frame control of 6000x6000": "APNG frame 1 (6000x6000 at 0,0) does not fit the image's 40x30 size",
    "webp: animated, canvas patched to 1x1": "WebP frame 0 (40x30 at 0,0) does not fit the image's 1x1 size",
    "bmp: negative width": "negative width -64",
    "tiff (Pillow opens it; not taken)": "not a PNG, JPEG, GIF, WebP or BMP",
}


def pillow_size(data: bytes, kind: str) -> tuple[int, int]:
    with Image.open(io.BytesIO(data), formats=[PIL_FORMAT[kind]]) as image:
        size: tuple[int, int] = image.size
        return size


@pytest.mark.parametrize(("name", "data"), [(name, case[0]) for name, case in hostile_images(BUDGET).items()])
def test_a_hostile_image_is_refused_for_its_frames_or_read_at_pillows_size(
    name: str, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # opening reads sizes only; let Pillow say the bomb's
    if name in REFUSED_BY_STRUCTURE:
        with pytest.raises(ValueError, match=None) as refused:
            read_header(data)
        assert REFUSED_BY_STRUCTURE[name] in str(refused.value), str(refused.value)
        return
    header = read_header(data)  # the pixels may still be broken: the decoder's to find
    assert pillow_size(data, header.format) == (header.width, header.height), name


def test_the_issues_gif_is_refused_though_its_header_says_1x1() -> None:
    data = hostile_images(BUDGET)["gif: 1x1 screen holding a 7000x7000 frame"][0]
    assert struct.unpack("<HH", data[6:10]) == (1, 1) and len(data) < 40_000
    assert pillow_size(data, "gif") == (7000, 7000)  # what Pillow would decode: 49 megapixels
    with pytest.raises(ValueError, match="a decoder would make more pixels than the header says"):
        read_header(data)


def test_fuzzed_images_get_a_value_error_or_pillows_size() -> None:
    agreed = refused = 0
    for data in fuzzed_images(300, seed=1):
        try:
            header = read_header(data)
        except ValueError:
            refused += 1
            continue
        try:
            size = pillow_size(data, header.format)
        except Exception:  # Pillow cannot even open it: the decoder refuses it later
            continue
        assert size == (header.width, header.height), (header, size)
        agreed += 1
    print(f"\n300 fuzzed images: {refused} refused by their structure, {agreed} read at Pillow's size")
    assert refused and agreed


def test_an_os2_bitmap_core_header_reads_16_bit_sizes() -> None:
    pixels = b"\x00" * (((3 * 5 + 3) // 4) * 4 * 7)
    header = struct.pack("<IHHHH", 12, 5, 7, 1, 24)
    data = b"BM" + struct.pack("<IHHI", 14 + len(header) + len(pixels), 0, 0, 14 + len(header)) + header + pixels
    header = read_header(data)
    assert (header.format, header.width, header.height) == ("bmp", 5, 7) and pillow_size(data, "bmp") == (5, 7)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP"])
def test_every_format_reads_its_kind(fmt: str) -> None:
    header = read_header(pillow_bytes(noise(30, 20), fmt))
    assert (PIL_FORMAT[header.format], header.width, header.height) == (fmt, 30, 20)
    assert header.decode_bytes == (16 if fmt == "WEBP" else 4) * 30 * 20


@pytest.mark.parametrize(
    ("options", "per_pixel"),
    [
        ({}, 4.0),  # baseline: the output only
        ({"progressive": True, "subsampling": 2}, 4 + 2 * 1.5),  # 4:2:0: Y whole, Cb and Cr a quarter each
        ({"progressive": True, "subsampling": 0}, 4 + 2 * 3),
    ],
)
def test_a_progressive_jpeg_counts_its_coefficient_buffer(options: dict[str, object], per_pixel: float) -> None:
    header = read_header(pillow_bytes(Image.new("RGB", (64, 48)), "JPEG", **options))
    assert header.decode_bytes == per_pixel * 64 * 48
    grey = read_header(pillow_bytes(Image.new("L", (64, 48)), "JPEG", progressive=True))
    assert grey.decode_bytes == (1 + 2) * 64 * 48
