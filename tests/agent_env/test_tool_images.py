"""Tool observations with images: `ToolOutput` through the tool runner (bytes become data URLs, references stay),
every bad image an `invalid_image` observation that costs the step nothing else, `Observation.images` on the wire
and in the tool message, the qwen3-vl feedback render against the official template, and the ready `crop` and
`plot_chart` tools checked against Pillow's own crop and resize and a decoded PNG."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from PIL import Image

from agent_env import (
    FAILURE_CODES,
    ChartTool,
    CropTool,
    FunctionCallEnvironment,
    ImageLimits,
    Observation,
    ToolContext,
    ToolOutput,
    ToolRunner,
    crop,
    plot_chart,
    tool,
)
from agent_protocol import get_protocol
from agent_protocol.images import image_size, read_image
from agent_protocol.types import Action, Message, ToolCall
from tests.support.family_checks import as_vllm_passes, check_feedback
from tests.support.hf_jinja import official_template

VISION = "<|vision_start|><|image_pad|><|vision_end|>"


def png(width: int, height: int, *, seed: int = 0) -> bytes:
    """A PNG of random pixels (so that any resampling or offset mistake changes them), made with Pillow."""
    rng = random.Random(seed)
    image = Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def decoded(url: str) -> Image.Image:
    image = Image.open(io.BytesIO(read_image(url)))
    image.load()
    return image


def run(runner: ToolRunner, *calls: ToolCall, task: dict[str, Any] | None = None) -> list[Observation]:
    return asyncio.run(runner.run(list(calls), ToolContext(episode_id="t", task=task or {})))


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


# -- ToolOutput through the runner ------------------------------------------------------------------------------


def returning(name: str, output: object) -> Any:
    """A tool that returns `output` as it is."""

    async def give() -> object:
        return output

    return tool(give, name=name)


@tool
def echo(text: str) -> str:
    """Say it back."""
    return text


def test_bytes_become_a_data_url_of_their_type_and_references_stay_as_given(tmp_path: Path) -> None:
    picture = png(12, 7)
    jpeg = io.BytesIO()
    Image.open(io.BytesIO(picture)).save(jpeg, format="JPEG")
    path = tmp_path / "shot.png"
    path.write_bytes(picture)
    given = ToolOutput(text="three", images=[picture, jpeg.getvalue(), data_url(picture), str(path), path.as_uri()])
    (observation,) = run(ToolRunner([returning("shots", given)]), call("shots"))
    assert observation.ok and observation.code is None and observation.content == "three"
    first, second, *rest = observation.images
    assert first == data_url(picture) and read_image(first) == picture
    assert second.startswith("data:image/jpeg;base64,") and image_size(read_image(second)) == (12, 7)
    assert rest == [data_url(picture), str(path), path.as_uri()]


def test_a_lone_image_is_one_image_and_a_list_is_kept_as_a_tuple() -> None:
    picture = png(2, 2)
    assert ToolOutput(images=picture).images == (picture,)
    assert ToolOutput(images="a.png").images == ("a.png",)
    assert ToolOutput(images=iter(["a.png", picture])).images == ("a.png", picture)


def test_text_only_tools_are_unchanged() -> None:
    runner = ToolRunner([echo, returning("numbers", {"a": [1, 2]})])
    text, numbers = run(runner, call("echo", "c1", text="hi"), call("numbers", "c2"))
    assert (text.content, text.images, numbers.content) == ("hi", (), '{"a":[1,2]}')
    message = text.to_message()
    assert message.images == () and message.to_openai()["content"] == "hi"  # a plain string, not parts
    assert "images" not in msgspec.json.decode(msgspec.json.encode(text))


def test_truncation_cuts_the_text_and_keeps_the_images() -> None:
    picture = png(4, 4)
    runner = ToolRunner([returning("long", ToolOutput(text="x" * 50, images=[picture]))], max_output_chars=10)
    (observation,) = run(runner, call("long"))
    assert observation.ok and observation.code == "output_truncated"
    assert observation.content.startswith("x" * 10 + "\n[output truncated")
    assert observation.images == (data_url(picture),)


def bad_images(tmp_path: Path) -> list[tuple[list[object], ImageLimits, str]]:
    """(images a tool returns, the runner's limits, what the message must say) for every way an image is bad."""
    default = ImageLimits()
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not an image")
    big = png(40, 30)
    return [
        ([b"hello, not an image"], default, "images[0]: the data is not a PNG, JPEG, GIF, WebP or BMP image"),
        ([big, b"GIF89a"], default, "images[1]: the data is not a PNG"),  # a cut-off header
        ([str(tmp_path / "missing.png")], default, "images[0]: image file"),
        ([str(text_file)], default, "images[0]: the data is not a PNG"),
        (["data:text/plain;base64,aGVsbG8="], default, "images[0]: a data URL of type 'text/plain' is not an image"),
        (["data:image/png;base64,@@@"], default, "images[0]: the data URL's base64 cannot be decoded"),
        (["https://example.com/a.png"], default, "images[0]: https image URLs are not fetched"),
        ([big], ImageLimits(max_image_bytes=len(big) - 1), f"images[0] is {len(big)} bytes; the limit is"),
        ([data_url(big)], ImageLimits(max_image_bytes=100), f"images[0] is {len(big)} bytes; the limit is 100"),
        ([big], ImageLimits(max_image_pixels=1199), "images[0] is 40x30 = 1200 pixels; the limit is 1199 pixels"),
        ([big] * 3, ImageLimits(max_images=2), "the tool returned 3 images; at most 2 are shown per call"),
        ([big, 7], default, "images[1] is of type int; an image is the bytes of a PNG"),
    ]


def test_every_bad_image_is_an_invalid_image_observation_and_the_step_goes_on(tmp_path: Path) -> None:
    cases = bad_images(tmp_path)
    for images, limits, expected in cases:
        runner = ToolRunner([returning("shots", ToolOutput(text="see", images=images)), echo], image_limits=limits)
        bad, good = run(runner, call("shots", "c1"), call("echo", "c2", text="still here"))
        assert not bad.ok and bad.code == "invalid_image" and bad.images == ()
        body = json.loads(bad.content)
        assert body["error"]["code"] == "invalid_image"
        assert expected in body["error"]["message"], (expected, body["error"]["message"])
        assert body["hint"]
        assert bad.tool_call_id == "c1" and good.tool_call_id == "c2"
        assert good.ok and good.content == "still here"
    assert len(cases) == 12 and "invalid_image" in FAILURE_CODES


def test_a_file_over_the_byte_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.png"
    path.write_bytes(png(8, 8) + b"\0" * 5000)  # a valid header: only the size can refuse it
    runner = ToolRunner(
        [returning("shots", ToolOutput(images=[str(path)]))], image_limits=ImageLimits(max_image_bytes=1000)
    )
    (observation,) = run(runner, call("shots"))
    assert observation.code == "invalid_image" and "bytes; the limit is 1000 bytes" in observation.content


def test_image_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="max_images must be at least 1"):
        ImageLimits(max_images=0)


# -- the observation on the wire and as a message --------------------------------------------------------------


def test_observation_with_images_round_trips_and_old_records_decode() -> None:
    observation = Observation(tool_call_id="c", name="crop", content="the crop", images=(data_url(png(3, 3)), "a.png"))
    assert msgspec.json.decode(msgspec.json.encode(observation), type=Observation) == observation
    old = b'{"tool_call_id":"c","name":"t","content":"5"}'  # written before images existed
    assert msgspec.json.decode(old, type=Observation).images == ()


def test_to_message_puts_images_before_the_text_and_round_trips_through_openai() -> None:
    urls = (data_url(png(5, 4)), "file:///data/b.png")
    message = Observation(tool_call_id="c7", name="crop", content="the crop", images=urls).to_message()
    assert [(part.url, part.offset) for part in message.images] == [(urls[0], 0), (urls[1], 0)]
    wire = message.to_openai()
    assert wire["content"] == [
        {"type": "image_url", "image_url": {"url": urls[0]}},
        {"type": "image_url", "image_url": {"url": urls[1]}},
        {"type": "text", "text": "the crop"},
    ]
    assert Message.from_openai(wire) == message


def test_qwen3_vl_feedback_shows_the_images_before_the_text_as_the_official_template_does() -> None:
    observation = Observation(tool_call_id="c1", name="crop", content="the crop", images=(data_url(png(6, 6)),))
    protocol = get_protocol("qwen3-vl")
    feedback = protocol.render_feedback([observation.to_message()])
    assert f"<tool_response>\n{VISION}the crop\n</tool_response>" in feedback
    action = Action(content="", tool_calls=(ToolCall(id="c1", name="crop", arguments={"bbox": [0, 0, 2, 2]}),))
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(png(9, 9))}},
                {"type": "text", "text": "look"},
            ],
        },
        action.to_message().to_openai(),
        observation.to_message().to_openai(),
    ]

    def official(msgs: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
        return official_template("qwen3_vl_instruct").render(
            messages=as_vllm_passes(msgs), tools=tools, add_generation_prompt=generation
        )

    assert check_feedback(protocol, official, messages, [crop.spec.to_openai()], 1, turn_end="<|im_end|>")


# -- crop -------------------------------------------------------------------------------------------------------


def expected_crop(data: bytes, box: tuple[int, int, int, int], size: tuple[int, int]) -> Image.Image:
    """Pillow's own crop and bicubic resize of the same region."""
    return Image.open(io.BytesIO(data)).convert("RGB").crop(box).resize(size, Image.Resampling.BICUBIC)


def test_crop_equals_pillows_crop_and_resize_from_bytes_data_urls_and_paths(tmp_path: Path) -> None:
    first, second = png(64, 48, seed=1), png(30, 90, seed=2)
    path = tmp_path / "second.png"
    path.write_bytes(second)
    for images in ([first, second], [data_url(first), str(path)], [data_url(first), path.as_uri()]):
        task = {"images": images}
        zoomed, other = run(
            ToolRunner([crop]),
            call("crop", "c1", bbox=[10, 5, 30, 20], zoom=3),
            call("crop", "c2", bbox=[0, 40, 30, 90], image=1, zoom=1.5),
            task=task,
        )
        assert zoomed.ok and other.ok, (zoomed.content, other.content)
        assert zoomed.images[0].startswith("data:image/png;base64,")
        got = decoded(zoomed.images[0])
        assert got.size == (60, 45) and got.mode == "RGB"
        assert got.tobytes() == expected_crop(first, (10, 5, 30, 20), (60, 45)).tobytes()
        assert decoded(other.images[0]).tobytes() == expected_crop(second, (0, 40, 30, 90), (45, 75)).tobytes()
        assert zoomed.content == "Image 0, box [10, 5, 30, 20] (20x15 pixels), shown at 60x45."


def test_crop_at_zoom_one_is_the_exact_region() -> None:
    data = png(20, 20, seed=3)
    (observation,) = run(ToolRunner([crop]), call("crop", bbox=[2, 3, 9, 17], zoom=1), task={"images": [data]})
    region = Image.open(io.BytesIO(data)).crop((2, 3, 9, 17))
    assert decoded(observation.images[0]).tobytes() == region.tobytes()


def test_crop_lowers_the_zoom_to_stay_within_its_pixel_limit() -> None:
    data = png(100, 80, seed=4)
    small = CropTool(max_output_pixels=2000)
    (observation,) = run(ToolRunner([small]), call("crop", bbox=[0, 0, 40, 20], zoom=8), task={"images": [data]})
    got = decoded(observation.images[0])
    assert got.size == (63, 31) and got.size[0] * got.size[1] <= 2000  # floor(40 * sqrt(2.5)), floor(20 * ...)
    assert got.tobytes() == expected_crop(data, (0, 0, 40, 20), (63, 31)).tobytes()
    assert "zoom lowered from 8 to stay within 2000 pixels" in observation.content


@pytest.mark.parametrize(
    ("task", "arguments", "code", "message"),
    [
        (
            {"images": ["IMG"]},
            {"bbox": [0, 0, 65, 10]},
            "tool_error",
            "image 0 is 64x48 pixels, so right must be at most 64",
        ),
        ({"images": ["IMG"]}, {"bbox": [0, 40, 10, 49]}, "tool_error", "bottom at most 48"),
        ({"images": ["IMG"]}, {"bbox": [10, 0, 10, 5]}, "tool_error", "is empty: right must be greater than left"),
        (
            {"images": ["IMG"]},
            {"bbox": [0, 0, 5, 5], "image": 2},
            "tool_error",
            "there is no image 2: the task has 1 image",
        ),
        ({}, {"bbox": [0, 0, 5, 5]}, "tool_error", "this task has no images to crop"),
        ({"images": ["missing.png"]}, {"bbox": [0, 0, 5, 5]}, "tool_error", "task image 0 cannot be read"),
        ({"images": ["IMG"]}, {"bbox": [0, 0, 5]}, "invalid_arguments", "argument `bbox`"),
        ({"images": ["IMG"]}, {"bbox": [-1, 0, 5, 5]}, "invalid_arguments", "argument `bbox[0]`"),
        ({"images": ["IMG"]}, {"bbox": [0, 0, 5, 5], "zoom": 9}, "invalid_arguments", "argument `zoom`"),
    ],
)
def test_crop_refuses_what_it_cannot_show_with_a_message_to_act_on(
    task: dict[str, Any], arguments: dict[str, Any], code: str, message: str
) -> None:
    images = [data_url(png(64, 48)) if ref == "IMG" else ref for ref in task.get("images", [])]
    (observation,) = run(ToolRunner([crop]), call("crop", **arguments), task={"images": images} if task else {})
    assert not observation.ok and observation.code == code
    assert message in json.loads(observation.content)["error"]["message"]


def test_crop_reads_the_task_through_the_environment() -> None:
    data = png(32, 32, seed=5)

    async def episode() -> list[Observation]:
        env = FunctionCallEnvironment(tools=[crop])
        await env.reset({"prompt": "what is in the corner?", "images": [data_url(data)]})
        action = Action(tool_calls=(ToolCall(id="z", name="crop", arguments={"bbox": [0, 0, 8, 8], "zoom": 2}),))
        observations, done = await env.step(action)
        assert not done
        return list(observations)

    (observation,) = asyncio.run(episode())
    assert observation.ok
    assert decoded(observation.images[0]).tobytes() == expected_crop(data, (0, 0, 8, 8), (16, 16)).tobytes()


def test_function_call_environment_takes_image_limits() -> None:
    two = returning("two", ToolOutput(text="x", images=[png(4, 4), png(5, 5)]))

    async def episode(limits: ImageLimits) -> Observation:
        env = FunctionCallEnvironment(tools=[two], image_limits=limits)
        await env.reset({"prompt": "p"})
        (observation,), _ = await env.step(Action(tool_calls=(call("two"),)))
        return observation

    assert asyncio.run(episode(ImageLimits())).ok
    refused = asyncio.run(episode(ImageLimits(max_images=1)))
    assert refused.code == "invalid_image" and "at most 1" in refused.content and not refused.images


# -- plot_chart -------------------------------------------------------------------------------------------------


def test_chart_is_a_decodable_png_of_the_stated_size_and_the_same_bytes_every_time() -> None:
    arguments = {"labels": ["Q1", "Q2", "Q3"], "values": [3, 7.5, 5], "title": "Sales", "y_label": "units"}
    first, again, line = run(
        ToolRunner([plot_chart]),
        call("plot_chart", "c1", **arguments),
        call("plot_chart", "c2", **arguments),
        call("plot_chart", "c3", **arguments, kind="line"),
    )
    assert first.ok and first.content == "A bar chart titled 'Sales' of 3 values, 640x480 pixels."
    assert first.images[0].startswith("data:image/png;base64,")
    image = decoded(first.images[0])
    assert image.format == "PNG" and image.size == (640, 480)
    assert not {"Software", "Creation Time", "date:create"} & set(image.info)
    assert first.images == again.images and line.images != first.images
    assert decoded(line.images[0]).size == (640, 480)
    colors = {color for _, color in image.convert("RGB").getcolors(maxcolors=640 * 480) or []}
    assert (31, 119, 180) in colors  # matplotlib's default blue: bars were drawn


def test_chart_size_follows_the_tool() -> None:
    (observation,) = run(
        ToolRunner([ChartTool(width=320, height=200, dpi=50)]), call("plot_chart", labels=["a"], values=[1])
    )
    assert decoded(observation.images[0]).size == (320, 200)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"labels": ["a", "b"], "values": [1]}, "argument `values`: has 1 numbers for 2 labels"),
        ({"labels": ["a"], "values": [float("nan")]}, "argument `values[0]`: nan is not a finite number"),
        ({"labels": [], "values": []}, "argument `labels`"),
        ({"labels": ["a"], "values": [1], "kind": "pie"}, "argument `kind`"),
    ],
)
def test_chart_arguments_are_checked(arguments: dict[str, Any], field: str) -> None:
    (observation,) = run(ToolRunner([plot_chart]), call("plot_chart", **arguments))
    assert observation.code == "invalid_arguments" and field in json.loads(observation.content)["error"]["message"]


# -- the extra ----------------------------------------------------------------------------------------------------


def test_importing_agent_env_loads_neither_pillow_nor_matplotlib() -> None:
    probe = (
        "import sys, agent_env, agent_env.tools; print(sorted(m for m in ('PIL', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(ImportError, match=r"needs Pillow, which is not installed: pip install 'agent-env\[vision\]'"):
        CropTool()
    with pytest.raises(ImportError, match=r"needs matplotlib.*agent-env\[vision\]"):
        ChartTool()
