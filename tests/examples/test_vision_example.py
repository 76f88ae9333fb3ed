"""The vision example in CI: its smoke mode's episodes end the way its README says (the expert zooms, reads and
scores 1.0; the record holds a span of pads for the picture and for the tool's crop; the engine was given both;
the hf engine runs the tiny random Qwen2.5-VL end to end), and its data is reproducible and right: each answer
is read back from the picture's pixels here, by code that shares nothing with the generator but the seven-segment
alphabet."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from agent_env import EpisodeRecord
from agent_protocol.images import read_image
from agent_runtime import Recipe, load_recipe
from examples.vision import build_data
from examples.vision import smoke as vision_smoke

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vision"
PNG_URL = "data:image/png;base64,"

# Qwen2.5-VL's image processor defaults: 14-pixel patches merged 2x2, so one pad per 28x28 pixels.
PAD_SIDE = 28
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280


def picture(url: str) -> Image.Image:
    return Image.open(io.BytesIO(read_image(url))).convert("RGB")


def qwen25_vl_pads(url: str) -> int:
    """Pads Qwen2.5-VL's processor gives an image that needs no rescaling (sides rounded to 28, pixels in range)."""
    width, height = picture(url).size
    rows, columns = round(height / PAD_SIDE), round(width / PAD_SIDE)
    assert MIN_PIXELS <= rows * columns * PAD_SIDE**2 <= MAX_PIXELS, "this check covers unscaled images only"
    return rows * columns


@pytest.fixture(scope="module", autouse=True)
def _tokenizer(qwen3_tokenizer_file: Path) -> None:
    """Build (or find) the offline Qwen3 tokenizer through the shared fixture before the smoke mode runs."""


@pytest.fixture(scope="module")
def smoke() -> vision_smoke.SmokeResult:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return asyncio.run(vision_smoke.run_smoke(count=6, out=False))


def reads(result: vision_smoke.SmokeResult) -> list[vision_smoke.Episode]:
    episodes = [e for e in result.episodes if e.kind == "read"]
    assert episodes
    return episodes


# -- the recipe ---------------------------------------------------------------------------------------------------


def test_recipe_is_a_vision_agent_with_the_crop_tool() -> None:
    recipe = load_recipe(EXAMPLE / "recipe.py")
    assert isinstance(recipe, Recipe)
    session = recipe.make_session(vision_smoke.qwen_vl_tokenizer())
    assert session.protocol.name == "qwen3-vl" and session.protocol.accepts_images
    assert recipe.max_images is not None and recipe.max_images >= 2
    assert [tool.name for tool in recipe.environment().tools] == ["crop"]
    rows = list(recipe.rows("test"))
    assert len(rows) >= 20
    for row in rows:
        parts = row["prompt"][0]["content"]
        assert parts[0] == {"type": "image_url", "image_url": {"url": row["images"][0]}}
        assert parts[0]["image_url"]["url"].startswith(PNG_URL) and parts[1]["type"] == "text"
        assert row["answer"].isdigit()


def test_reward_is_an_exact_match_on_the_answer_tag() -> None:
    rewards = load_recipe(EXAMPLE / "recipe.py").rewards
    assert rewards is not None

    def score(answer: str, reference: str) -> float:
        record = EpisodeRecord(final_answer=answer, references=(reference,))
        return asyncio.run(rewards.score(record)).total

    assert score("<answer> 931 </answer>", "931") == 1.0
    assert score("<answer> 981 </answer>", "931") == 0.0
    assert score("931", "931") == 0.0  # no tag, no credit


# -- the expert (scripted engine) ---------------------------------------------------------------------------------


def test_expert_answers_every_question_right(smoke: vision_smoke.SmokeResult) -> None:
    assert [e.reward for e in smoke.episodes] == [1.0] * 6
    assert [e.answer for e in smoke.episodes] == [f"<answer> {e.expected} </answer>" for e in smoke.episodes]
    assert {e.kind for e in smoke.episodes} == {"read", "count"}
    assert all(e.tool_calls == ["crop"] for e in smoke.episodes if e.kind == "read")
    assert all(e.tool_calls == [] for e in smoke.episodes if e.kind == "count")
    assert not [e.errors for e in smoke.episodes if e.errors]


def test_expert_record_spans_the_picture_and_the_crop(smoke: vision_smoke.SmokeResult) -> None:
    rows = {row["id"]: row for row in build_data.rows("test")}
    for episode in reads(smoke):
        picture_span, crop_span = episode.spans  # exactly two images: the task's and the tool's
        assert picture_span.source == rows[episode.id]["images"][0]
        assert crop_span.source.startswith(PNG_URL) and crop_span.source != picture_span.source
        assert picture_span.end <= crop_span.start  # the crop comes in the tool result, after the prompt
        lengths = [s.end - s.start for s in episode.spans]
        assert episode.pads == lengths  # every id of a span is a pad
        assert lengths == [qwen25_vl_pads(s.source) for s in episode.spans] == episode.expected_pads
        assert lengths[0] == (336 // PAD_SIDE) * (448 // PAD_SIDE)


def test_the_crop_is_the_tag_enlarged(smoke: vision_smoke.SmokeResult) -> None:
    for episode in reads(smoke):
        crop = picture(episode.spans[1].source)
        assert crop.width >= 4 * 3 * 7 and crop.height >= 4 * 12  # three 7x12 digits, at 4x
        dark = crop.convert("L").point(lambda level: 255 if level < 128 else 0).getbbox()
        assert dark is not None  # the ink is in it


def test_engine_was_given_the_picture_then_both_images(smoke: vision_smoke.SmokeResult) -> None:
    for episode in reads(smoke):
        picture_url, crop_url = (s.source for s in episode.spans)
        assert episode.images_seen == [(picture_url,), (picture_url, crop_url)]
    for episode in smoke.episodes:
        if episode.kind == "count":
            assert len(episode.images_seen) == 1 and len(episode.images_seen[0]) == 1


def test_streamed_episode_shows_the_zoom_and_the_answer(smoke: vision_smoke.SmokeResult) -> None:
    lines = smoke.streamed
    assert any("tool call  crop(" in line and '"zoom": 4' in line for line in lines)
    assert any("tool result crop: Image 0, box" in line for line in lines)
    assert lines[-1].startswith("[final]") and "reward=1.00" in lines[-1]


# -- the hf engine on the tiny random Qwen2.5-VL -------------------------------------------------------------------


def _processor_pads(urls: tuple[str, ...]) -> list[int]:
    """Pads per image by the tiny model's own transformers image processor (grid t*h*w / merge**2)."""
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path
    from tests.support.tiny_qwen_vl import offline_processor, tiny_qwen_vl_path

    processor = offline_processor(tiny_qwen_vl_path(qwen3_tokenizer_path()))
    grids = processor.image_processor(images=[picture(u) for u in urls], return_tensors="pt")["image_grid_thw"]
    return [int(g.prod()) // 4 for g in grids]


def test_tiny_model_runs_an_episode_on_the_picture(smoke: vision_smoke.SmokeResult) -> None:
    tiny = smoke.tiny
    assert tiny is not None and not tiny.errors and tiny.stop_reason is not None
    assert tiny.images_seen and tiny.images_seen[0] == (tiny.spans[0].source,)
    assert [s.end - s.start for s in tiny.spans[:1]] == _processor_pads(tiny.images_seen[0])[:1]


def test_tiny_model_is_given_the_tools_crop(smoke: vision_smoke.SmokeResult) -> None:
    hand_off = smoke.hand_off
    assert hand_off is not None and not hand_off.errors
    assert hand_off.tool_calls[0] == "crop"
    picture_url, crop_url = (s.source for s in hand_off.spans[:2])
    assert hand_off.images_seen[0] == (picture_url, crop_url)  # the hf engine's first call: both images
    assert [s.end - s.start for s in hand_off.spans[:2]] == _processor_pads((picture_url, crop_url))


# -- the data -----------------------------------------------------------------------------------------------------


def _digest(rows: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_data_is_the_same_bytes_from_the_same_seed() -> None:
    first = [build_data.make_row("test", i) for i in range(4)]
    assert first == [build_data.make_row("test", i) for i in range(4)]
    assert len({build_data.image_bytes(row) for row in first}) == 4  # and different rows differ
    code = (
        "import hashlib, json; from examples.vision import build_data as b; "
        "print(hashlib.sha256(json.dumps([b.make_row('test', i) for i in range(4)], sort_keys=True).encode())"
        ".hexdigest())"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == _digest(first)  # another process (another hash seed) draws the same bytes


# The standard seven-segment alphabet (a top, b upper right, c lower right, d bottom, e lower left, f upper left,
# g middle), and where each segment of a 7x12 digit with 2-pixel strokes has a pixel of its own.
SEVEN_SEGMENTS = {
    "abcdef": "0",
    "bc": "1",
    "abdeg": "2",
    "abcdg": "3",
    "bcfg": "4",
    "acdfg": "5",
    "acdefg": "6",
    "abc": "7",
    "abcdefg": "8",
    "abcdfg": "9",
}
PROBES = {"a": (3, 0), "b": (6, 2), "c": (6, 9), "d": (3, 11), "e": (0, 9), "f": (0, 2), "g": (3, 5)}
COLOURS = {"red": (214, 39, 40), "green": (44, 160, 44), "blue": (31, 119, 180), "yellow": (230, 190, 20)}


def read_tag(image: Image.Image, corner: str) -> str:
    """The number drawn in `corner` (the 120x60 pixels there), read at the picture's own scale."""
    vertical, horizontal = corner.split("-")
    x0 = 0 if horizontal == "left" else image.width - 120
    y0 = 0 if vertical == "top" else image.height - 60
    region = image.crop((x0, y0, x0 + 120, y0 + 60))
    px = region.load()
    assert px is not None
    ink = [[max(px[x, y]) < 100 for x in range(120)] for y in range(60)]  # type: ignore[arg-type]  # dark grey
    columns = [x for x in range(120) if any(ink[y][x] for y in range(60))]
    top = min(y for y in range(60) if any(ink[y]))
    groups: list[list[int]] = []
    for x in columns:
        if groups and x == groups[-1][-1] + 1:
            groups[-1].append(x)
        else:
            groups.append([x])
    digits = ""
    for group in groups:
        left = group[-1] - 6  # a digit's right edge is always lit (b or c); a one is its right strokes only
        lit = "".join(s for s, (dx, dy) in PROBES.items() if 0 <= left + dx < 120 and ink[top + dy][left + dx])
        digits += SEVEN_SEGMENTS[lit]
    return digits


def count_colour(image: Image.Image, colour: str) -> int:
    """How many separate patches of the colour the picture has: each found one is flood-filled black."""
    image = image.copy()
    px = image.load()
    assert px is not None
    patches = 0
    for y in range(image.height):
        for x in range(image.width):
            if px[x, y] == COLOURS[colour]:
                ImageDraw.floodfill(image, (x, y), (0, 0, 0), thresh=0)
                patches += 1
    return patches


def test_answers_are_what_the_pixels_show() -> None:
    kinds = set()
    for row in list(build_data.rows("test"))[:24]:
        image = Image.open(io.BytesIO(base64.b64decode(row["images"][0].removeprefix(PNG_URL)))).convert("RGB")
        assert image.size == (448, 336)
        question = row["prompt"][0]["content"][1]["text"]
        if row["kind"] == "read":
            corner = question.split("in the ", 2)[2].split(" corner")[0]
            assert read_tag(image, corner) == row["answer"], question
        else:
            colour = question.removeprefix("How many ").split()[0]
            assert count_colour(image, colour) == int(row["answer"]), question
        kinds.add(row["kind"])
    assert kinds == {"read", "count"}


# -- the README ---------------------------------------------------------------------------------------------------


def test_readme_names_the_smoke_and_real_model_commands() -> None:
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    assert "uv run python -m examples.vision.smoke" in readme
    assert "uv run python -m examples.vision.build_data" in readme
    assert "uv run apps/train --backend openrlhf --recipe examples/vision/recipe.py" in readme
    assert "uv run apps/serve" in readme and "--recipe examples/vision/recipe.py" in readme
    assert "examples.vision.smoke" in (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
