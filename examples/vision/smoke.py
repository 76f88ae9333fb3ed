"""Smoke mode of the vision example: look, zoom, answer, on CPU, with no model download.

    uv run python -m examples.vision.smoke          # from the repository root

Three runs of the recipe, loaded as the apps load it:

1. **The expert** (`AgentRuntime` with a `LookingEngine`, a `ScriptedEngine` whose policy is also shown each
   call's images, as a vision-language model is). It stands in for a trained model and is held to what one could
   do: it is given the prompt ids and the images and nothing else. For a ``read`` question it finds the dark marks
   in the named corner of the picture, calls `crop` on them at 4x, then reads the seven-segment digits off the
   enlarged crop it is shown in the tool result; for a ``count`` question it counts the shapes of that colour in
   the picture and answers at once. Its completions are real Qwen3 token ids; the images' pads are expanded by
   Qwen2.5-VL's image processor grid (`VisionGrid()`'s defaults), so the record holds one span of pads per image.
2. **The hf engine** on a tiny random-weight Qwen2.5-VL (`tests/support/tiny_qwen_vl.py`, built from a config):
   the real model class and image processor get the picture's pixels. Its output is gibberish, so the episode
   scores 0; what counts is that it runs end to end.
3. **A hand-off**: the expert's first turn (the crop call), then the tiny model: the hf engine is given the
   picture and the tool's crop, both through the image processor.
"""

from __future__ import annotations

import asyncio
import io
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from agent_protocol import HFTokenizer, Tokenizer
from agent_protocol.images import ImageSpan, VisionGrid, read_image
from agent_runtime import AgentRuntime, LLMEngine, Recipe, RunResult, ScriptedEngine, load_recipe
from agent_runtime.engines.base import Generation, SamplingParams
from examples._smoke import Prompt, describe, quiet_logs, qwen3_tokenizer_file, reply, tool_call
from examples.vision import build_data

if TYPE_CHECKING:
    from PIL.Image import Image

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")
IMAGE_PAD: Final = "<|image_pad|>"
ZOOM: Final = 4
HF_MAX_NEW_TOKENS: Final = 12  # the tiny model's turns (greedy): enough to show gibberish, quick on a CPU

_VISION: Final = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)*<\|vision_end\|>")
_READ: Final = re.compile(r"in the (top|bottom)-(left|right) corner")
_COUNT: Final = re.compile(r"How many (\w+) shapes")
_DARK: Final = 128  # a grey level below this is ink

# Where each segment of a seven-segment digit is lit, as fractions of the digit's width and height.
_SEGMENT_POINTS: Final = {
    "a": (0.5, 1 / 12),
    "b": (13 / 14, 0.27),
    "c": (13 / 14, 0.73),
    "d": (0.5, 11 / 12),
    "e": (1 / 14, 0.73),
    "f": (1 / 14, 0.27),
    "g": (0.5, 0.5),
}
_DIGITS: Final = {frozenset(segments): digit for digit, segments in build_data.SEGMENTS.items()}


# -- what the expert sees -----------------------------------------------------------------------------------------


def open_image(url: str) -> Image:
    """An image reference as a Pillow RGB image."""
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(read_image(url))) as opened:
        return opened.convert("RGB")


def find_tag(picture: Image, corner: str) -> list[int] | None:
    """The box around the ink in `corner`'s region of the picture, with a margin, or None when it holds none."""
    region = build_data.corner_region(corner)
    gray = picture.crop(region).convert("L")
    ink = gray.point(lambda level: 255 if level < _DARK else 0).getbbox()
    if ink is None:
        return None
    margin = 6
    left, top = region[0] + ink[0] - margin, region[1] + ink[1] - margin
    right, bottom = region[0] + ink[2] + margin, region[1] + ink[3] + margin
    return [max(0, left), max(0, top), min(picture.width, right), min(picture.height, bottom)]


def read_number(image: Image) -> str | None:
    """The seven-segment number in `image` (at any scale), or None when a mark is not a digit."""
    gray = image.convert("L")
    ink = gray.point(lambda level: 255 if level < _DARK else 0)
    box = ink.getbbox()
    if box is None:
        return None
    top, height = box[1], box[3] - box[1]
    digit_width = height * build_data.DIGIT_W / build_data.DIGIT_H
    columns = [ink.crop((x, 0, x + 1, ink.height)).getbbox() is not None for x in range(ink.width)]
    digits = []
    for start, end in _runs(columns):
        if end - start < digit_width / 2:  # only the right-hand strokes: a one
            digits.append("1")
            continue
        lit = frozenset(
            name
            for name, (fx, fy) in _SEGMENT_POINTS.items()
            if gray.getpixel((int(start + fx * (end - start)), int(top + fy * height))) < _DARK  # type: ignore[operator]
        )
        if lit not in _DIGITS:
            return None
        digits.append(_DIGITS[lit])
    return "".join(digits) or None


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """The [start, end) of every run of True in `flags`."""
    runs, start = [], None
    for index, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            runs.append((start, index))
            start = None
    return runs


def count_shapes(picture: Image, rgb: tuple[int, int, int]) -> int:
    """How many separate patches of exactly the colour `rgb` the picture has (8-connected)."""
    from PIL import ImageChops

    bands = [
        band.point(lambda level, want=want: 255 if level == want else 0)
        for band, want in zip(picture.split(), rgb, strict=True)
    ]
    mask = ImageChops.multiply(ImageChops.multiply(bands[0], bands[1]), bands[2])
    width, height = picture.size
    todo = bytearray(mask.tobytes())
    patches = 0
    for first in range(len(todo)):
        if not todo[first]:
            continue
        patches += 1
        todo[first] = 0
        stack = [first]
        while stack:
            y, x = divmod(stack.pop(), width)
            for ny in (y - 1, y, y + 1):
                for nx in (x - 1, x, x + 1):
                    if 0 <= ny < height and 0 <= nx < width and todo[ny * width + nx]:
                        todo[ny * width + nx] = 0
                        stack.append(ny * width + nx)
    return patches


def expert(prompt: Prompt, images: Sequence[str]) -> str:
    """The expert's next turn, from the decoded prompt and the images it holds (the task's picture first)."""
    question = _VISION.sub("", prompt.question)
    picture = open_image(images[0])
    if found := _COUNT.search(question):
        colour = build_data.COLOURS.get(found.group(1))
        count = count_shapes(picture, colour) if colour else 0
        return reply(f"<answer> {count} </answer>", None)
    if (found := _READ.search(question)) is None:
        return reply("<answer> unknown </answer>", None)
    if not prompt.tool_results():
        box = find_tag(picture, f"{found.group(1)}-{found.group(2)}")
        if box is None:
            return reply("<answer> unknown </answer>", None)
        return tool_call("crop", {"bbox": box, "zoom": ZOOM}, None)
    number = read_number(open_image(images[-1])) if len(images) > 1 else None
    return reply(f"<answer> {number or 'unknown'} </answer>", None)


# -- engines ------------------------------------------------------------------------------------------------------


class LookingEngine(ScriptedEngine):
    """A `ScriptedEngine` whose policy is given each call's decoded prompt and its images (`policy(prompt,
    images)`), as a vision-language model is given pixels with its ids."""

    def __init__(self, tokenizer: Tokenizer, policy: Callable[[Prompt, Sequence[str]], str]) -> None:
        def answer(prompt_ids: Sequence[int], images: Sequence[str]) -> str:
            return policy(Prompt.parse(tokenizer.decode(prompt_ids)), images)

        super().__init__(tokenizer, image_policy=answer)


class HandOff(LLMEngine):
    """`first` answers the first call, `then` every later one (one episode at a time)."""

    name = "hand-off"
    accepts_images = True

    def __init__(self, first: LLMEngine, then: LLMEngine) -> None:
        self.first, self.then = first, then
        self.tokenizer = then.tokenizer
        self.context_length = then.context_length
        self.stop_token_ids = then.stop_token_ids
        self.calls = 0

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        engine = self.first if self.calls == 0 else self.then
        self.calls += 1
        if images:
            return await engine.generate(prompt_ids, sampling, images=images)  # type: ignore[call-arg]
        return await engine.generate(prompt_ids, sampling)


class RecordingEngine(LLMEngine):
    """`inner`, decoding greedily (the same gibberish on every run) with each call's new tokens capped at
    `max_new_tokens`, and the images of each call recorded (`images_seen`)."""

    accepts_images = True

    def __init__(self, inner: LLMEngine, *, max_new_tokens: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.tokenizer = inner.tokenizer
        self.context_length = inner.context_length
        self.stop_token_ids = inner.stop_token_ids
        self.max_new_tokens = max_new_tokens
        self.images_seen: list[tuple[str, ...]] = []

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        self.images_seen.append(tuple(images))
        capped = msgspec.structs.replace(
            sampling, max_new_tokens=min(sampling.max_new_tokens, self.max_new_tokens), temperature=0.0
        )
        if images:
            return await self.inner.generate(prompt_ids, capped, images=images)  # type: ignore[call-arg]
        return await self.inner.generate(prompt_ids, capped)


def qwen_vl_tokenizer() -> HFTokenizer:
    """The Qwen3 tokenizer with Qwen2.5-VL's image processor grid (patch 14, merge 2, the default pixel range)."""
    plain = HFTokenizer.from_file(qwen3_tokenizer_file())
    return HFTokenizer(plain.backend, source=plain.source, vision=VisionGrid())


# -- the smoke ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    """One episode's outcome, and what the engine and the record say about its images."""

    id: str
    kind: str
    question: str
    expected: str
    answer: str | None
    reward: float
    stop_reason: str | None
    errors: list[str]
    tool_calls: list[str]
    images_seen: list[tuple[str, ...]]  # the images of each engine call, in order
    spans: list[ImageSpan]  # the record's image spans
    pads: list[int]  # how many pad ids the record holds at each span
    expected_pads: list[int]  # how many the image processor's grid gives each span's image


def _episode(
    row: dict[str, Any], result: RunResult, images_seen: list[tuple[str, ...]], tokenizer: Tokenizer
) -> Episode:
    record = result.trajectory.segments[-1]
    pad_id = tokenizer.token_to_id(IMAGE_PAD)
    grid = getattr(tokenizer, "vision", None)
    return Episode(
        id=row["id"],
        kind=row["kind"],
        question=row["prompt"][0]["content"][1]["text"],
        expected=row["answer"],
        answer=result.final_answer,
        reward=result.reward,
        stop_reason=result.stop_reason,
        errors=[f"{e.code}: {e.message}" for e in result.trajectory.errors],
        tool_calls=[c.name for m in result.trajectory.messages for c in m.tool_calls],
        images_seen=images_seen,
        spans=list(record.images),
        pads=[sum(1 for i in record.ids[s.start : s.end] if i == pad_id) for s in record.images],
        expected_pads=[grid.pads_for(s.source) if grid else -1 for s in record.images],
    )


async def run_expert(recipe: Recipe, rows: list[dict[str, Any]]) -> list[Episode]:
    """The expert's episodes, one engine each (so each engine's `images_seen` is one episode's)."""
    tokenizer = qwen_vl_tokenizer()
    episodes = []
    for row in rows:
        engine = LookingEngine(tokenizer, expert)
        runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
        result = await runtime.run(row["prompt"], task=row)
        episodes.append(_episode(row, result, engine.images_seen, tokenizer))
    return episodes


async def run_tiny_model(recipe: Recipe, row: dict[str, Any]) -> tuple[Episode, Episode]:
    """One episode on the tiny random Qwen2.5-VL alone, and one where the expert plays the first turn (the crop
    call) and the tiny model the rest. The model is built (once, cached in `.cache/`) and loaded here."""
    from agent_runtime.engines.hf import HFEngine
    from tests.support.tiny_qwen_vl import tiny_qwen_vl_path

    hf = HFEngine.from_pretrained(tiny_qwen_vl_path(qwen3_tokenizer_file()), device="cpu", dtype="float32")
    episodes = []
    try:
        for hand_off in (False, True):
            seen = RecordingEngine(hf, max_new_tokens=HF_MAX_NEW_TOKENS)
            engine: LLMEngine = HandOff(LookingEngine(hf.tokenizer, expert), seen) if hand_off else seen
            runtime = AgentRuntime(engine, recipe.make_session(hf.tokenizer), sampling=recipe.sampling)
            result = await runtime.run(row["prompt"], task=row)
            episodes.append(_episode(row, result, seen.images_seen, hf.tokenizer))
    finally:
        await hf.close()
    return episodes[0], episodes[1]


@dataclass(frozen=True)
class SmokeResult:
    episodes: list[Episode]  # the expert's
    streamed: list[str]  # one read episode of the expert's, as events
    tiny: Episode | None  # the tiny model alone
    hand_off: Episode | None  # the expert's crop call, then the tiny model


async def run_smoke(count: int = 8, *, tiny_model: bool = True, out: bool = True) -> SmokeResult:
    recipe = load_recipe(RECIPE_PATH)
    rows = list(recipe.rows("test"))[:count]
    say = print if out else (lambda _: None)

    first = next(r for r in rows if r["kind"] == "read")
    question = first["prompt"][0]["content"][1]["text"]
    say(f"== {recipe.name}: the expert, one episode streamed ==\nuser: [picture {first['id']}] {question}")
    tokenizer = qwen_vl_tokenizer()
    engine = LookingEngine(tokenizer, expert)
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
    streamed = []
    async for event in runtime.stream(first["prompt"], task=first):
        streamed.append(describe(event))
        say("  " + streamed[-1])

    episodes = await run_expert(recipe, rows)
    for e in episodes:
        spans = ", ".join(f"[{s.start}:{s.end}]" for s in e.spans)
        say(f"  {e.question:84s} -> {e.answer!s:18s} gold {e.expected:4s} reward={e.reward}  image spans {spans}")
    say(f"== {len(episodes)} episodes, mean reward {sum(e.reward for e in episodes) / len(episodes):.2f} ==")

    tiny = hand_off = None
    if tiny_model:
        tiny, hand_off = await run_tiny_model(recipe, first)
        for title, e in (("the tiny random Qwen2.5-VL", tiny), ("the expert's crop, then the tiny model", hand_off)):
            say(f"== {title} (hf engine, CPU) ==")
            say(f"  answer {e.answer!r} stop={e.stop_reason} reward={e.reward} errors={e.errors or 'none'}")
            say(f"  tool calls {e.tool_calls}; images per hf call {[len(i) for i in e.images_seen]}")
    return SmokeResult(episodes=episodes, streamed=streamed, tiny=tiny, hand_off=hand_off)


def main() -> int:
    quiet_logs()
    result = asyncio.run(run_smoke())
    right = all(e.reward == 1.0 for e in result.episodes)
    ran = all(e is not None and not e.errors for e in (result.tiny, result.hand_off))
    return 0 if right and ran else 1


if __name__ == "__main__":
    sys.exit(main())
