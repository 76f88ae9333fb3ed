"""Build the vision example's pictures and questions with Pillow from one seed, at run time.

    uv run python -m examples.vision.build_data --out /tmp/vision            # write {train,test}.jsonl there
    uv run python -m examples.vision.build_data --out /tmp/vision --pngs 4   # and the first 4 test pictures

Each picture is a 448x336 white canvas with five to nine filled shapes (circles, squares, triangles) in four
colours, and a small three-digit number in one corner, drawn as a seven-segment display 12 pixels high: at the
picture's size it is a few vision tokens wide, so reading it takes a closer look (the `crop` tool). Two kinds of
question alternate: ``read`` ("What number is written in the small tag in the top-right corner of the picture?")
and ``count`` ("How many blue shapes are in the picture?"). Shapes never touch one another or the corners, and
every shape and digit is drawn without anti-aliasing, so each colour's pixels are exact and a program can check an
answer by reading the pixels.

A row is ``{"id", "kind", "prompt", "images", "answer"}``: `prompt` is one user message whose content is the
picture (an ``image_url`` part holding a ``data:image/png;base64,`` URL) and the question; `images` lists the same
URL, for the `crop` tool, which reads the task's images from the row; `answer` is the reference the reward
matches. Row ``i`` of a split is drawn from ``random.Random(f"{SEED}-{split}-{i}")`` alone, so rows are the same
bytes on every run, in any order, and nothing needs to be shipped: the recipe generates them as they are read.
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

SEED: Final = 1804
SPLIT_SIZES: Final = {"test": 48, "train": 4096}
WIDTH: Final = 448
HEIGHT: Final = 336
BACKGROUND: Final = (255, 255, 255)
INK: Final = (40, 40, 40)  # the tag's digits
COLOURS: Final = {
    "red": (214, 39, 40),
    "green": (44, 160, 44),
    "blue": (31, 119, 180),
    "yellow": (230, 190, 20),
}
SHAPES: Final = ("circle", "square", "triangle")
CORNERS: Final = ("top-left", "top-right", "bottom-left", "bottom-right")
KINDS: Final = ("read", "count")

# The seven-segment digits: each digit is DIGIT_W x DIGIT_H pixels, strokes STROKE wide, DIGIT_GAP apart.
DIGIT_W: Final = 7
DIGIT_H: Final = 12
STROKE: Final = 2
DIGIT_GAP: Final = 3
#: the segments lit for each digit (a top, b upper right, c lower right, d bottom, e lower left, f upper left,
#: g middle)
SEGMENTS: Final = {
    "0": "abcdef",
    "1": "bc",
    "2": "abdeg",
    "3": "abcdg",
    "4": "bcfg",
    "5": "acdfg",
    "6": "acdefg",
    "7": "abc",
    "8": "abcdefg",
    "9": "abcdfg",
}
#: where the tag may sit: a CORNER_W x CORNER_H region in each corner, CORNER_MARGIN from the edges; no shape
#: enters any of the four regions
CORNER_W: Final = 96
CORNER_H: Final = 40
CORNER_MARGIN: Final = 6
SHAPE_GAP: Final = 8

Box = tuple[int, int, int, int]  # left, top, right, bottom; right and bottom exclusive, as Pillow crops


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    box: Box


@dataclass(frozen=True)
class Scene:
    """What one picture shows: its shapes, and its tag (`number` in the corner `corner`, inside `tag_box`)."""

    shapes: tuple[Shape, ...]
    number: str
    corner: str
    tag_box: Box

    def count(self, colour: str) -> int:
        return sum(1 for shape in self.shapes if shape.colour == colour)


def corner_region(corner: str) -> Box:
    """The region of `corner` where a tag may sit."""
    left = CORNER_MARGIN if corner.endswith("left") else WIDTH - CORNER_MARGIN - CORNER_W
    top = CORNER_MARGIN if corner.startswith("top") else HEIGHT - CORNER_MARGIN - CORNER_H
    return left, top, left + CORNER_W, top + CORNER_H


def _overlaps(a: Box, b: Box, gap: int) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def make_scene(rng: random.Random) -> Scene:
    """A random scene: five to nine shapes that keep `SHAPE_GAP` from each other and out of the corners."""
    number = str(rng.randint(100, 999))
    corner = rng.choice(CORNERS)
    region = corner_region(corner)
    width = len(number) * DIGIT_W + (len(number) - 1) * DIGIT_GAP
    left = rng.randint(region[0], region[2] - width)
    top = rng.randint(region[1], region[3] - DIGIT_H)
    tag_box = (left, top, left + width, top + DIGIT_H)
    corners = [corner_region(c) for c in CORNERS]
    shapes: list[Shape] = []
    wanted = rng.randint(5, 9)
    while len(shapes) < wanted:
        size = rng.randint(28, 48)
        x, y = rng.randint(4, WIDTH - size - 4), rng.randint(4, HEIGHT - size - 4)
        box = (x, y, x + size, y + size)
        taken = [s.box for s in shapes] + corners
        if any(_overlaps(box, other, SHAPE_GAP) for other in taken):
            continue
        shapes.append(Shape(kind=rng.choice(SHAPES), colour=rng.choice(list(COLOURS)), box=box))
    return Scene(shapes=tuple(shapes), number=number, corner=corner, tag_box=tag_box)


def _segment_boxes(left: int, top: int) -> dict[str, Box]:
    """Each segment's rectangle for a digit whose top-left pixel is (left, top)."""
    w, h, s = DIGIT_W, DIGIT_H, STROKE
    half = (h - s) // 2  # the middle bar's top row
    return {
        "a": (left, top, left + w, top + s),
        "g": (left, top + half, left + w, top + half + s),
        "d": (left, top + h - s, left + w, top + h),
        "f": (left, top, left + s, top + half + s),
        "b": (left + w - s, top, left + w, top + half + s),
        "e": (left, top + half, left + s, top + h),
        "c": (left + w - s, top + half, left + w, top + h),
    }


def draw(scene: Scene) -> bytes:
    """The scene as PNG bytes (no anti-aliasing, no metadata: equal scenes give equal bytes)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUND)
    pen = ImageDraw.Draw(image)
    for shape in scene.shapes:
        left, top, right, bottom = shape.box
        fill = COLOURS[shape.colour]
        if shape.kind == "circle":
            pen.ellipse((left, top, right - 1, bottom - 1), fill=fill)
        elif shape.kind == "square":
            pen.rectangle((left, top, right - 1, bottom - 1), fill=fill)
        else:
            pen.polygon([((left + right - 1) // 2, top), (left, bottom - 1), (right - 1, bottom - 1)], fill=fill)
    x, y = scene.tag_box[0], scene.tag_box[1]
    for digit in scene.number:
        boxes = _segment_boxes(x, y)
        for segment in SEGMENTS[digit]:
            left, top, right, bottom = boxes[segment]
            pen.rectangle((left, top, right - 1, bottom - 1), fill=INK)
        x += DIGIT_W + DIGIT_GAP
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def png_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def question(scene: Scene, kind: str, rng: random.Random) -> tuple[str, str]:
    """A question of `kind` about `scene`, and its answer."""
    if kind == "read":
        return f"What number is written in the small tag in the {scene.corner} corner of the picture?", scene.number
    colour = rng.choice(list(COLOURS))
    return f"How many {colour} shapes are in the picture?", str(scene.count(colour))


def make_row(split: str, index: int) -> dict[str, Any]:
    """Row `index` of `split` (see the module docstring)."""
    rng = random.Random(f"{SEED}-{split}-{index}")
    scene = make_scene(rng)
    kind = KINDS[index % len(KINDS)]
    text, answer = question(scene, kind, rng)
    url = png_data_url(draw(scene))
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {
        "id": f"{split}-{index:04d}",
        "kind": kind,
        "prompt": [{"role": "user", "content": content}],
        "images": [url],
        "answer": answer,
    }


def rows(split: str) -> Iterator[dict[str, Any]]:
    """The rows of `split` ("train" or "test"), generated as they are read."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"the vision example has the splits {sorted(SPLIT_SIZES)}, not {split!r}")
    for index in range(SPLIT_SIZES[split]):
        yield make_row(split, index)


def image_bytes(row: dict[str, Any]) -> bytes:
    """The PNG bytes of a row's picture."""
    url: str = row["images"][0]
    return base64.b64decode(url.split(",", 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the vision example's rows as JSONL (and some pictures).")
    parser.add_argument("--out", type=Path, required=True, help="directory for train.jsonl and test.jsonl")
    parser.add_argument("--pngs", type=int, default=0, help="also write the first N test pictures as PNG files")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for split in ("test", "train"):
        path = args.out / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as file:
            for row in rows(split):
                file.write(json.dumps(row) + "\n")
        print(f"wrote {path} ({SPLIT_SIZES[split]} rows, {path.stat().st_size / 1e6:.1f} MB)")
    for row in itertools.islice(rows("test"), args.pngs):
        png = args.out / f"{row['id']}.png"
        png.write_bytes(image_bytes(row))
        print(f"wrote {png}: {row['prompt'][0]['content'][1]['text']} -> {row['answer']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
