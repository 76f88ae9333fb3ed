"""Qwen3-VL-Instruct (`agent_protocol.protocols.qwen_vl`): renders with images and tools against the golden files
(tests/data/golden/vision, generated here from the official template) and the official Jinja, the Hermes parser
without reasoning, feedback that carries images, the refusals (an image where the template drops it, a text-only
family given an image), and token-in-token-out through a session with the real Qwen tokenizer.

Jinja-side adaptations are vLLM's (`as_vllm_passes`): null content as "", arguments given as a JSON string as the
object they hold. Messages with images go to the template as OpenAI content parts, as vLLM passes them to a template
that iterates content.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer, Message, MessageError, get_protocol, list_protocols
from agent_protocol.protocols.qwen_vl import IMAGE_PLACEHOLDER, image_urls
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    as_vllm_passes,
    check_feedback,
    compare_with_jinja,
    episode_splits,
    episode_text,
    observations_after,
    official_episode,
)
from tests.support.hf_jinja import official_template
from tests.support.qwen_conversations import CONVERSATIONS
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "qwen3_vl_instruct"
VISION = Path(__file__).resolve().parents[2] / "data" / "golden" / "vision"


def png(width: int, height: int) -> bytes:
    """A valid grey PNG of the given size (pure Python, so this module needs no PIL)."""
    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def data_url(width: int, height: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(width, height)).decode()


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False) -> str:
    """The official template as transformers renders it (hf_jinja's environment; it takes no special tokens)."""
    return official_template(STEM).render(
        messages=as_vllm_passes(messages), tools=tools, add_generation_prompt=generation
    )


# -- conversations with images ----------------------------------------------------------------------------------

URLS = [data_url(w, h) for w, h in ((8, 8), (300, 200), (56, 1200))] + ["file:///data/chart.png", "images/crop.png"]


def with_images(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """`messages` with images put into some user and tool messages (at the start, the end or inside the text, one
    or two, sometimes two in a row), and some system and user texts given as lists of text parts."""
    out = copy.deepcopy(messages)
    for message in out:
        text = message.get("content")
        if message["role"] == "system" and isinstance(text, str) and rng.random() < 0.3:
            message["content"] = [{"type": "text", "text": text[:3]}, {"type": "text", "text": text[3:]}]
        if message["role"] not in ("user", "tool") or not isinstance(text, str) or rng.random() < 0.4:
            continue
        parts: list[dict[str, Any]] = []
        cut = rng.randint(0, len(text))
        for piece in (text[:cut], text[cut:]):
            if piece or rng.random() < 0.2:
                parts.append({"type": "text", "text": piece})
            for _ in range(rng.choice([0, 1, 1, 2])):
                parts.append({"type": "image_url", "image_url": {"url": rng.choice(URLS)}})
        message["content"] = parts
    return out


def _vision_conversation(seed: int) -> tuple[list[dict[str, Any]], Any]:
    """The text conversation of `seed` with images, and tools of every shape (one in eight keeps none)."""
    messages, tools = CONVERSATIONS[seed]
    rng = random.Random(1000 + seed)
    if not tools and seed % 8:
        tools = rng.sample(TOOL_SHAPES, rng.randint(1, 3))
    return with_images(messages, rng), tools


VISION_CONVERSATIONS = [_vision_conversation(seed) for seed in range(len(CONVERSATIONS))]


def test_generated_conversations_hold_images_and_tools() -> None:
    flat = [m for messages, _ in VISION_CONVERSATIONS for m in messages]
    images = [p for m in flat if isinstance(m.get("content"), list) for p in m["content"] if p["type"] == "image_url"]
    assert len(images) >= 300
    assert any(m["role"] == "tool" and isinstance(m["content"], list) for m in flat)
    with_both = [m for m, tools in VISION_CONVERSATIONS if tools and any(isinstance(x.get("content"), list) for x in m)]
    assert len(with_both) >= 150


# -- golden renders ---------------------------------------------------------------------------------------------

GOLDEN_CASES = json.loads((VISION / "cases.json").read_text(encoding="utf-8"))
GOLDEN = [(case, gen) for case in GOLDEN_CASES for gen in (False, True)]


def golden_path(case: dict[str, Any], generation: bool) -> Path:
    return VISION / "rendered" / f"{STEM}__{case['name']}__gen_{str(generation).lower()}.txt"


@pytest.mark.parametrize(("case", "generation"), GOLDEN, ids=lambda x: x["name"] if isinstance(x, dict) else str(x))
def test_golden_render_byte_for_byte(case: dict[str, Any], generation: bool) -> None:
    expected = golden_path(case, generation).read_text(encoding="utf-8")
    assert official(case["messages"], case["tools"], generation) == expected  # the golden file is the template's
    protocol = get_protocol("qwen3-vl")
    assert protocol.render_messages(case["messages"], tools=case["tools"], add_generation_prompt=generation) == expected


def test_golden_cases_cover_images_and_tools() -> None:
    assert len(GOLDEN) >= 12
    rendered = [golden_path(case, True).read_text(encoding="utf-8") for case in GOLDEN_CASES]
    assert sum(text.count(IMAGE_PLACEHOLDER) for text in rendered) >= 6
    assert any("<tool_response>\n<|vision_start|>" in text for text in rendered)
    assert any("# Tools" in text for text in rendered)


# -- generated conversations against the official Jinja ---------------------------------------------------------


def test_python_renderer_equals_official_jinja_with_images_and_tools() -> None:
    compared, refused = compare_with_jinja(
        get_protocol("qwen3-vl"), official, VISION_CONVERSATIONS, refused_by=(Exception,), refusal="empty"
    )
    assert compared >= 300 and compared + refused == 400


def test_text_only_conversations_equal_official_jinja() -> None:
    compared, _ = compare_with_jinja(
        get_protocol("qwen3-vl"), official, CONVERSATIONS, refused_by=(Exception,), refusal="empty"
    )
    assert compared >= 300


def test_image_urls_follow_the_render_order() -> None:
    protocol = get_protocol("qwen3-vl")
    for messages, tools in VISION_CONVERSATIONS:
        if not messages:
            continue
        urls = image_urls(messages)
        text = protocol.render_messages(messages, tools=tools)
        assert text.count(IMAGE_PLACEHOLDER) == len(urls)
        expected = [
            p["image_url"]["url"]
            for m in messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if p["type"] == "image_url"
        ]
        assert urls == expected


# -- refusals ---------------------------------------------------------------------------------------------------

IMAGE = {"type": "image_url", "image_url": {"url": URLS[0]}}


@pytest.mark.parametrize("role", ["system", "assistant"])
def test_an_image_where_the_template_drops_it_is_refused(role: str) -> None:
    messages = [{"role": role, "content": [{"type": "text", "text": "x"}, IMAGE]}, {"role": "user", "content": "q"}]
    with pytest.raises(MessageError, match=f"only in user and tool messages, not in a {role}"):
        get_protocol("qwen3-vl").render_messages(messages)


@pytest.mark.parametrize(
    ("part", "location", "problem"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!"}},
            "content[1].image_url.url",
            "base64",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}},
            "content[1].image_url.url",
            "not an image",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
            "content[1].image_url.url",
            "not a PNG",
        ),
        ({"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}, "content[1].image_url.url", "not fetched"),
        ({"type": "image_url", "image_url": 7}, "content[1].image_url", "must be an object"),
        ({"type": "image_url", "image_url": {"url": 7}}, "content[1].image_url.url", "non-empty string"),
        ({"type": "video", "video": "v.mp4"}, "content[1]", "type 'video'"),
        ("just text", "content[1]", "a str"),
    ],
    ids=["bad_base64", "not_image_type", "not_image_bytes", "remote", "not_object", "url_not_str", "video", "bare"],
)
def test_bad_image_parts_name_message_and_part(part: Any, location: str, problem: str) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": "text", "text": "a"}, part]}]
    with pytest.raises(MessageError, match=problem) as info:
        get_protocol("qwen3-vl").render_messages(messages)
    assert info.value.location == f"messages[1].{location}"


TEXT_ONLY = [name for name in list_protocols() if not get_protocol(name).accepts_images]


@pytest.mark.parametrize("name", TEXT_ONLY)
def test_a_text_only_family_refuses_an_image_saying_so(name: str) -> None:
    protocol = get_protocol(name)
    user = {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]}
    tool = {"role": "tool", "tool_call_id": "abcdefghi", "name": "f", "content": [IMAGE]}
    with pytest.raises(MessageError, match="text-only") as info:
        protocol.render_messages([{"role": "user", "content": "hi"}, user])
    assert info.value.location == "messages[1].content[1]"
    with pytest.raises(MessageError, match="text-only"):
        protocol.render_feedback([tool])
    with pytest.raises(MessageError, match="text-only"):
        protocol.render_messages([Message.from_openai(user)])  # a Message that already holds the image


def test_feedback_refuses_system_and_assistant_messages() -> None:
    protocol = get_protocol("qwen3-vl")
    for role in ("system", "assistant"):
        with pytest.raises(MessageError, match="feedback carries tool or user messages"):
            protocol.render_feedback([{"role": role, "content": "x"}])
    with pytest.raises(MessageError, match="at least one"):
        protocol.render_feedback([])


# -- parsing: vLLM's hermes parser, no reasoning ----------------------------------------------------------------


@pytest.mark.parametrize("index", range(60))
def test_parse_inverts_render_generation(index: int) -> None:
    protocol = get_protocol("qwen3-vl")
    for message in CONVERSATIONS[index][0]:
        if message["role"] == "assistant":
            generated = protocol.render_generation(message)
            parsed = protocol.assistant_message(generated)
            assert protocol.render_generation(parsed) == generated
            assert parsed.reasoning_content is None


def test_parse_reads_hermes_calls_like_qwen2_5() -> None:
    text = 'Looking.\n<tool_call>\n{"name": "zoom", "arguments": {"box": [0, 0, 10, 10]}}\n</tool_call><|im_end|>'
    ours = get_protocol("qwen3-vl").parse_assistant_text(text)
    assert ours == get_protocol("qwen2.5").parse_assistant_text(text)
    assert ours.content == "Looking." and [(c.name, c.arguments) for c in ours.tool_calls] == [
        ("zoom", {"box": [0, 0, 10, 10]})
    ]


# -- feedback and episodes --------------------------------------------------------------------------------------


def test_feedback_with_images_continues_the_official_render() -> None:
    protocol = get_protocol("qwen3-vl")
    checked = with_images_checked = 0
    for messages, tools in VISION_CONVERSATIONS + CONVERSATIONS:
        for turn in episode_splits(messages):
            observations = observations_after(messages, turn)
            if any(m["role"] == "system" for m in observations):
                continue  # the template renders nothing for them; feedback refuses them
            assert check_feedback(protocol, official, messages, tools, turn, turn_end="<|im_end|>")  # append-only
            checked += 1
            with_images_checked += any(isinstance(m["content"], list) for m in observations)
    assert checked >= 250 and with_images_checked >= 50


def test_episode_text_is_the_official_render() -> None:
    protocol = get_protocol("qwen3-vl")
    compared = 0
    for messages, tools in VISION_CONVERSATIONS:
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns or turns[0] == 0 or any(b <= a + 1 for a, b in itertools.pairwise(turns)):
            continue
        if any(m["role"] == "system" for m in messages[1:]):
            continue
        assert episode_text(protocol, messages, tools) == official_episode(official, messages, tools)
        compared += 1
    assert compared >= 40


def test_cut_off_turn_is_closed_and_images_ride_in_the_tool_result() -> None:
    feedback = get_protocol("qwen3-vl").render_feedback(
        [{"role": "tool", "content": [{"type": "text", "text": "crop:"}, IMAGE]}], turn_closed=False
    )
    assert feedback == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\ncrop:<|vision_start|><|image_pad|><|vision_end|>\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


# -- token in, token out through the session (text) --------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def test_vision_tokens_are_single_ids(tokenizer: HFTokenizer) -> None:
    ids = tokenizer.encode(IMAGE_PLACEHOLDER + IMAGE_PLACEHOLDER)
    assert ids == [151652, 151655, 151653] * 2


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
    completions = ["I'll use the calculator.\n" + call + "<|im_end|>", "The answer is 391.<|im_end|>"]
    protocol = get_protocol("qwen3-vl")
    _, result, specs = run_calculator_episode(protocol, tokenizer, completions)
    assert result.final_answer == "The answer is 391."
    (segment,) = result.trajectory.segments
    rendered = protocol.render_messages(result.trajectory.messages, tools=specs)
    assert segment.ids == tokenizer.encode(rendered.removesuffix("\n"))  # append-only: no seam
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]
