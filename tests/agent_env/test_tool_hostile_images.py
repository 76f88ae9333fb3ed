"""Hostile images at the tool boundary: a tool that returns any case of `tests.support.hostile_images` (frames
larger than the header says, two JPEG frame headers, bombs, truncated and corrupt bodies, ...) or a fuzzed image
gets an ``invalid_image`` observation naming ``images[k]`` (or keeps a good image), decoded by the same rules a
server applies to its clients (`agent_env.image_decoder`); the call beside it goes on. The images of one call
share a pixel budget, and the crop tool decodes its task image under its own."""

from __future__ import annotations

import base64
import json

import pytest

from agent_env import CropTool, ImageLimits, ToolOutput, ToolRunner
from agent_env.image_decoder import ImageTooLarge, checked_size, decode_image, decode_reference
from tests.agent_env.test_tool_images import call, echo, png, returning, run
from tests.support.hostile_images import fuzzed_images, hostile_images, pillow_bytes

BUDGET = 1_000_000
HOSTILE = hostile_images(BUDGET)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_tool_returning_a_hostile_image_gets_invalid_image_or_keeps_a_good_one(name: str) -> None:
    data, expected = HOSTILE[name]
    runner = ToolRunner(
        [returning("shot", ToolOutput(text="see", images=[png(4, 4), data])), echo],
        image_limits=ImageLimits(max_image_pixels=BUDGET),
    )
    shot, other = run(runner, call("shot", "c1"), call("echo", "c2", text="still here"))
    assert other.ok and other.content == "still here"
    if expected == "ok":
        assert shot.ok and len(shot.images) == 2, shot.content
        return
    assert not shot.ok and shot.code == "invalid_image" and shot.images == ()
    message = json.loads(shot.content)["error"]["message"]
    assert message.startswith("images[1]"), message
    assert ("limit is" in message) == (expected == "image_too_large"), message


def test_fuzzed_tool_images_are_observations_never_crashes() -> None:
    images = fuzzed_images(60, seed=2)
    runner = ToolRunner([returning(f"t{k}", ToolOutput(images=[data])) for k, data in enumerate(images)])
    observations = [run(runner, call(f"t{k}", f"c{k}"))[0] for k in range(len(images))]
    codes = sorted({o.code or "ok" for o in observations})
    assert set(codes) <= {"ok", "invalid_image"}, codes
    print(f"\n60 fuzzed tool images: {sum(o.ok for o in observations)} shown, the rest invalid_image")


def test_the_images_of_one_call_share_a_pixel_budget() -> None:
    limits = ImageLimits(max_image_pixels=1200, max_total_pixels=2000)
    runner = ToolRunner([returning("two", ToolOutput(images=[png(40, 30), png(20, 30)]))], image_limits=limits)
    (observation,) = run(runner, call("two"))
    assert observation.ok and len(observation.images) == 2
    runner = ToolRunner([returning("two", ToolOutput(images=[png(40, 30), png(30, 30)]))], image_limits=limits)
    (observation,) = run(runner, call("two"))
    assert observation.code == "invalid_image"
    assert "the images up to images[1] hold 2100 pixels; the limit is 2000 pixels per call" in observation.content
    with pytest.raises(ValueError, match="max_total_pixels must be at least 1"):
        ImageLimits(max_total_pixels=0)


def test_the_decoder_checks_sizes_before_it_allocates() -> None:
    bomb = HOSTILE["png: decompression bomb over the budget"][0]
    with pytest.raises(ImageTooLarge, match=f"the limit is {BUDGET}"):
        checked_size(bomb, max_pixels=BUDGET)
    assert checked_size(bomb, max_pixels=None) == (1001, 1001)
    picture = decode_image(HOSTILE["png: decompression bomb at the budget"][0], max_pixels=BUDGET)
    assert picture.size == (1000, 1000) and picture.mode == "RGB"


@pytest.mark.parametrize(
    ("name", "phrase"),
    [
        ("gif: 1x1 screen holding a 7000x7000 frame", "does not fit the image's 1x1 size"),
        ("jpeg: two frame headers (SOF) before the scan", "2 frame headers"),
        ("png: IHDR claims the budget, data of 8x8", "cannot be decoded"),
        ("png: decompression bomb over the budget", "the limit is 1000000"),
    ],
)
def test_crop_decodes_its_task_image_within_its_budget(name: str, phrase: str) -> None:
    tool = CropTool(max_input_pixels=BUDGET)
    runner = ToolRunner([tool])
    (observation,) = run(runner, call("crop", bbox=[0, 0, 1, 1]), task={"images": [HOSTILE[name][0]]})
    assert observation.code == "tool_error" and "task image 0 cannot be read" in observation.content
    assert phrase in observation.content, observation.content


@pytest.mark.parametrize("name", [n for n, (_, expected) in HOSTILE.items() if expected == "invalid_image"])
def test_an_engines_image_is_refused_as_a_tool_image_is(name: str) -> None:
    """`decode_reference` (what the engines hand a model's processor) decodes with the same decoder: a broken
    image is a ValueError naming the image, never Pillow's own error or a half-decoded picture."""
    data = HOSTILE[name][0]
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    with pytest.raises(ValueError, match=r"^hf: image 2\b"):
        decode_reference(url, label="hf: image 2")


def test_an_engines_image_comes_back_in_rgb() -> None:
    grey = decode_image(png(4, 4)).convert("L")
    url = "data:image/png;base64," + base64.b64encode(pillow_bytes(grey, "PNG")).decode()
    picture = decode_reference(url, label="vllm: image 0")
    assert picture.mode == "RGB" and picture.size == (4, 4)
    with pytest.raises(ValueError, match=r"^vllm: image 0: image file '/nowhere.png' cannot be read"):
        decode_reference("/nowhere.png", label="vllm: image 0")
