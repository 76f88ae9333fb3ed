"""Qwen2.5-VL-Instruct (`agent_protocol.protocols.qwen2_5_vl`, the Qwen2-VL-Instruct template): renders with images in
every role against the official Jinja, feedback that continues the official render (system messages too), the
refusals (tools, tool calls, video, add_vision_id), the Hermes parser without reasoning, detection from a model
directory, and token-in-token-out through a session with the real Qwen tokenizer.

Jinja-side adaptation is vLLM's (`as_vllm_passes`: null content as ""). Messages with images go to the template as
OpenAI content parts, as vLLM passes them to a template that iterates content.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from agent_protocol import HFTokenizer, MessageError, detect_protocol, get_protocol
from agent_protocol.protocols.qwen_vl import IMAGE_PLACEHOLDER, image_urls
from tests.agent_protocol.families.test_qwen3_vl import URLS
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
from tests.support.hf_jinja import TEMPLATES, official_template
from tests.support.qwen_conversations import CONVERSATIONS

STEM = "qwen2_5_vl_instruct"
NAME = "qwen2.5-vl"


def official(messages: list[dict[str, Any]], tools: Any = None, generation: bool = False, **kwargs: Any) -> str:
    """The official template as transformers renders it (hf_jinja's environment; it takes no special tokens)."""
    return official_template(STEM).render(
        messages=as_vllm_passes(messages), tools=tools, add_generation_prompt=generation, **kwargs
    )


# -- conversations with images ----------------------------------------------------------------------------------


def without_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with each assistant turn's tool calls dropped (the template renders none; the protocol refuses
    them), its content kept."""
    out = copy.deepcopy(messages)
    for message in out:
        message.pop("tool_calls", None)
    return out


def with_images(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """`messages` with images put into messages of every role (at the start, the end or inside the text, one or
    two, sometimes two in a row), some texts given as lists of text parts, and now and then a system message
    moved into the middle (the template renders one anywhere)."""
    out = copy.deepcopy(messages)
    for message in out:
        text = message.get("content")
        if not isinstance(text, str) or rng.random() < 0.4:
            continue
        parts: list[dict[str, Any]] = []
        cut = rng.randint(0, len(text))
        for piece in (text[:cut], text[cut:]):
            if piece or rng.random() < 0.2:
                parts.append({"type": "text", "text": piece})
            for _ in range(rng.choice([0, 1, 1, 2]) if message["role"] in ("user", "tool") else rng.choice([0, 1])):
                parts.append({"type": "image_url", "image_url": {"url": rng.choice(URLS)}})
        message["content"] = parts
    if len(out) > 2 and rng.random() < 0.25:
        out.insert(rng.randint(1, len(out)), {"role": "system", "content": rng.choice(["mid-way rule", ""])})
    return out


def _vision_conversation(seed: int) -> list[dict[str, Any]]:
    messages, _ = CONVERSATIONS[seed]
    return with_images(without_calls(messages), random.Random(2000 + seed))


VISION_CONVERSATIONS: list[tuple[list[dict[str, Any]], Any]] = [
    (_vision_conversation(seed), None) for seed in range(len(CONVERSATIONS))
]
TEXT_CONVERSATIONS: list[tuple[list[dict[str, Any]], Any]] = [(without_calls(m), None) for m, _ in CONVERSATIONS]


def _images(message: dict[str, Any]) -> int:
    content = message.get("content")
    return sum(p["type"] == "image_url" for p in content) if isinstance(content, list) else 0


def test_generated_conversations_hold_images_in_every_role() -> None:
    flat = [m for messages, _ in VISION_CONVERSATIONS for m in messages]
    assert sum(_images(m) for m in flat) >= 300
    for role in ("system", "user", "assistant", "tool"):
        assert sum(_images(m) for m in flat if m["role"] == role) >= 5, role
    assert sum(any(m["role"] == "system" for m in ms[1:]) for ms, _ in VISION_CONVERSATIONS) >= 20


# -- the official Jinja -----------------------------------------------------------------------------------------


def test_the_template_is_the_official_one() -> None:
    text = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    assert text.startswith("{% set image_count = namespace(value=0) %}") and "tool" not in text
    parts = [{"type": "image_url", "image_url": {"url": URLS[0]}}, {"type": "text", "text": "Hi"}]
    rendered = official([{"role": "user", "content": parts}], generation=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_python_renderer_equals_official_jinja_with_images() -> None:
    compared, refused = compare_with_jinja(get_protocol(NAME), official, VISION_CONVERSATIONS)
    assert compared == 400 and refused == 0


def test_text_only_conversations_equal_official_jinja() -> None:
    compared, _ = compare_with_jinja(get_protocol(NAME), official, TEXT_CONVERSATIONS)
    assert compared == 400


def test_empty_conversation_renders_as_the_template_does() -> None:
    protocol = get_protocol(NAME)
    for generation in (False, True):
        assert protocol.render_messages([], add_generation_prompt=generation) == official([], None, generation)


def test_image_urls_follow_the_render_order() -> None:
    protocol = get_protocol(NAME)
    for messages, _ in VISION_CONVERSATIONS:
        urls = image_urls(messages)
        assert protocol.render_messages(messages).count(IMAGE_PLACEHOLDER) == len(urls)
        expected = [
            p["image_url"]["url"]
            for m in messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if p["type"] == "image_url"
        ]
        assert urls == expected


# -- refusals: what the template cannot express -------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "zoom", "description": "d", "parameters": {"type": "object"}}}
CALL = {"id": "abcdefghi", "type": "function", "function": {"name": "zoom", "arguments": {"box": [0, 0, 1, 1]}}}
IMAGE = {"type": "image_url", "image_url": {"url": URLS[0]}}


def test_tools_are_refused_pointing_at_qwen3_vl() -> None:
    messages = [{"role": "user", "content": "q"}]
    assert "zoom" not in official(messages, [TOOL], True)  # the template drops them
    with pytest.raises(MessageError, match="renders no tools; use the qwen3-vl protocol's Hermes") as info:
        get_protocol(NAME).render_messages(messages, tools=[TOOL])
    assert info.value.location == "tools"
    assert get_protocol(NAME).render_messages(messages, tools=[]) == official(messages, [], False)


def test_an_assistant_message_with_tool_calls_is_refused() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Looking.", "tool_calls": [CALL]}]
    assert "zoom" not in official(messages)  # the template drops them
    with pytest.raises(MessageError, match="renders no tool calls; use the qwen3-vl protocol") as info:
        get_protocol(NAME).render_messages(messages)
    assert info.value.location == "messages[1].tool_calls"


def test_video_and_add_vision_id_are_refused() -> None:
    video = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video", "video": "v.mp4"}]}]
    with pytest.raises(MessageError, match="type 'video'"):
        get_protocol(NAME).render_messages(video)
    assert "Picture 1: " in official([{"role": "user", "content": [IMAGE]}], add_vision_id=True)
    with pytest.raises(TypeError, match="add_vision_id"):
        get_protocol(NAME, add_vision_id=True)


@pytest.mark.parametrize("role", ["system", "assistant", "tool"])
def test_images_are_accepted_in_every_role_the_template_renders_them(role: str) -> None:
    messages = [{"role": "user", "content": "q"}, {"role": role, "content": [{"type": "text", "text": "x"}, IMAGE]}]
    assert get_protocol(NAME).render_messages(messages) == official(messages)
    assert official(messages).count(IMAGE_PLACEHOLDER) == 1


def test_generation_with_an_image_is_refused() -> None:
    with pytest.raises(MessageError, match="generated turn holds no image"):
        get_protocol(NAME).render_generation({"role": "assistant", "content": [IMAGE]})


def test_feedback_refuses_assistant_messages() -> None:
    protocol = get_protocol(NAME)
    with pytest.raises(MessageError, match="feedback carries tool, user or system messages"):
        protocol.render_feedback([{"role": "assistant", "content": "x"}])
    with pytest.raises(MessageError, match="at least one"):
        protocol.render_feedback([])


# -- parsing: vLLM's hermes parser, no reasoning ----------------------------------------------------------------


def test_parse_reads_hermes_calls_like_qwen3_vl() -> None:
    text = 'Looking.\n<tool_call>\n{"name": "zoom", "arguments": {"box": [0, 0, 10, 10]}}\n</tool_call><|im_end|>'
    ours = get_protocol(NAME).parse_assistant_text(text)
    assert ours == get_protocol("qwen3-vl").parse_assistant_text(text)
    assert ours.content == "Looking." and [(c.name, c.arguments) for c in ours.tool_calls] == [
        ("zoom", {"box": [0, 0, 10, 10]})
    ]


@pytest.mark.parametrize("index", range(60))
def test_parse_inverts_render_generation(index: int) -> None:
    protocol = get_protocol(NAME)
    for message in CONVERSATIONS[index][0]:
        if message["role"] == "assistant":
            generated = protocol.render_generation(message)
            parsed = protocol.assistant_message(generated)
            assert protocol.render_generation(parsed) == generated
            assert parsed.reasoning_content is None


def test_a_generated_turn_without_calls_is_the_templates() -> None:
    protocol = get_protocol(NAME)
    for messages, _ in TEXT_CONVERSATIONS[:60]:
        for index in episode_splits(messages):
            expected = official(messages[: index + 1]).removeprefix(official(messages[:index], None, True))
            assert protocol.render_generation(messages[index]) + "\n" == expected


# -- feedback and episodes --------------------------------------------------------------------------------------


def test_feedback_continues_the_official_render_every_seam() -> None:
    protocol = get_protocol(NAME)
    checked = with_images = with_system = 0
    for messages, tools in VISION_CONVERSATIONS + TEXT_CONVERSATIONS:
        for turn in episode_splits(messages):
            assert check_feedback(protocol, official, messages, tools, turn, turn_end="<|im_end|>")  # append-only
            observations = observations_after(messages, turn)
            checked += 1
            with_images += any(isinstance(m["content"], list) for m in observations)
            with_system += any(m["role"] == "system" for m in observations)
    assert checked >= 300 and with_images >= 50 and with_system >= 5


def test_episode_text_is_the_official_render() -> None:
    protocol = get_protocol(NAME)
    compared = 0
    for messages, tools in VISION_CONVERSATIONS + TEXT_CONVERSATIONS:
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns or turns[0] == 0 or any(b <= a + 1 for a, b in itertools.pairwise(turns)):
            continue
        if any(_images(messages[i]) for i in turns):
            continue  # a model generates no image
        assert episode_text(protocol, messages, tools) == official_episode(official, messages, tools)
        compared += 1
    assert compared >= 80


def test_cut_off_turn_is_closed_and_images_ride_in_the_tool_message() -> None:
    feedback = get_protocol(NAME).render_feedback(
        [{"role": "tool", "content": [{"type": "text", "text": "crop:"}, IMAGE]}], turn_closed=False
    )
    expected = official([{"role": "tool", "content": [{"type": "text", "text": "crop:"}, IMAGE]}], None, True)
    assert feedback == "<|im_end|>\n" + expected.split("<|im_end|>\n", 1)[1]


# -- detection --------------------------------------------------------------------------------------------------


def test_a_model_directory_with_chat_template_json_is_detected(tmp_path: Path) -> None:
    template = (TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    assert detect_protocol(tmp_path) == NAME


# -- token in, token out through the session (text) --------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def test_token_in_token_out_through_the_session(tokenizer: HFTokenizer) -> None:
    completions = ["The answer is 391.<|im_end|>"]
    _, result, _ = run_calculator_episode(NAME, tokenizer, completions, tools=[], rewards="none")
    assert result.final_answer == "The answer is 391."
    (segment,) = result.trajectory.segments
    messages = [m.to_openai() for m in result.trajectory.messages]
    assert segment.ids == tokenizer.encode(official(messages).removesuffix("\n"))  # the official render
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(c) for c in completions]


def test_a_session_with_tools_is_refused(tokenizer: HFTokenizer) -> None:
    with pytest.raises(MessageError, match="renders no tools"):
        run_calculator_episode(NAME, tokenizer, ["x<|im_end|>"], rewards="none")
