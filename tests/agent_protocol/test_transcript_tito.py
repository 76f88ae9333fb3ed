"""Token-in-token-out, with the real Qwen3 tokenizer, on every golden multi-turn case.

The transcript is built the way an episode builds it: the first prompt rendered and tokenized once, each
assistant turn appended as its generated token ids, each feedback delta tokenized on its own. Then:

1. Everything that is not a generated turn is byte-identical to the official template's render.
2. Where the template is append-only for the conversation, the ids equal the golden token ids of the
   official full render, token for token.
3. Where it is not (see README "What the transcript holds"), the transcript holds each turn as generated,
   and the only token-level difference from re-tokenizing the text is the documented seam where the
   prompt's `<think>\\n` meets a generated `\\n</think>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_protocol import ChatProtocol, HFTokenizer, TokenTranscript, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders

IM_START = "<|im_start|>"
NEWLINE, DOUBLE_NEWLINE, THINK_END = 198, 271, 151668


def _golden_for_tito() -> list[GoldenRender]:
    """One golden render per (template, variant, case): the one a finished episode would produce."""
    chosen = []
    for golden in renders():
        ends_with_assistant = cases()[golden.case]["messages"][-1]["role"] == "assistant"
        if golden.add_generation_prompt != ends_with_assistant:
            chosen.append(golden)
    return chosen


GOLDEN = _golden_for_tito()


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def build_transcript(
    protocol: ChatProtocol, tokenizer: HFTokenizer, messages: list[dict[str, Any]], tools: Any
) -> TokenTranscript:
    transcript = TokenTranscript()
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    first = turns[0] if turns else len(messages)
    transcript.append_prompt(tokenizer.encode(protocol.render_prompt(messages[:first], tools=tools)))
    for position, index in enumerate(turns):
        transcript.append_action(tokenizer.encode(protocol.render_generation(messages[index])))
        end = turns[position + 1] if position + 1 < len(turns) else len(messages)
        if end > index + 1:
            transcript.append_observation(tokenizer.encode(protocol.render_feedback(messages[index + 1 : end])))
    return transcript


def as_sampled_text(protocol: ChatProtocol, golden: GoldenRender) -> str:
    """The golden render with each assistant block replaced by the turn exactly as it was generated."""
    messages = cases()[golden.case]["messages"]
    generated = [protocol.render_generation(m) for m in messages if m["role"] == "assistant"]
    opener = protocol.generation_prompt.removeprefix(IM_START)
    blocks = golden.text.split(IM_START)
    out = [blocks[0]]
    for block in blocks[1:]:
        if block.startswith("assistant\n") and generated:  # a generated turn, not the final generation prompt
            block = opener + generated.pop(0) + "\n"
        out.append(block)
    text = IM_START.join(out)
    return text.removesuffix("\n") if messages[-1]["role"] == "assistant" else text


def test_every_golden_case_is_checked() -> None:
    assert len(GOLDEN) == 24  # 6 cases x (3 templates + the enable_thinking=False variant)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_transcript_matches_the_official_render(golden: GoldenRender, tokenizer: HFTokenizer) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    transcript = build_transcript(protocol, tokenizer, case["messages"], case["tools"])
    expected_text = as_sampled_text(protocol, golden)

    # 1. Outside the generated turns, every byte is the official render's.
    assert tokenizer.decode(transcript.ids) == expected_text

    golden_ids = golden.ids[:-1] if case["messages"][-1]["role"] == "assistant" else golden.ids
    golden_text = golden.text.removesuffix("\n") if case["messages"][-1]["role"] == "assistant" else golden.text
    if expected_text == golden_text:
        # 2. Append-only: token for token the tokenization of the official full render.
        assert transcript.ids == golden_ids
    else:
        # 3. Not append-only: the turns are kept as generated; re-tokenizing the text changes nothing except
        # the documented <think>\n|\n</think> seam of the forced-thinking prompt.
        retokenized = tokenizer.encode(expected_text)
        seams = _seams(transcript.ids)
        assert len(retokenized) == len(transcript.ids) - seams
        if seams == 0:
            assert retokenized == transcript.ids

    # Loss mask and action ranges cover exactly the generated turns.
    actions = [m for m in case["messages"] if m["role"] == "assistant"]
    assert len(transcript.action_ranges) == len(actions)
    for (start, end), message in zip(transcript.action_ranges, actions, strict=True):
        assert tokenizer.decode(transcript.ids[start:end]) == protocol.render_generation(message)
        assert transcript.loss_mask[start:end] == [1] * (end - start)
    assert sum(transcript.loss_mask) == sum(end - start for start, end in transcript.action_ranges)


def _seams(ids: list[int]) -> int:
    return sum(1 for a, b, c in zip(ids, ids[1:], ids[2:], strict=False) if (a, b, c) == (NEWLINE, NEWLINE, THINK_END))


def test_append_only_cases_are_the_ones_we_document(tokenizer: HFTokenizer) -> None:
    """Pin down where the official template is not append-only, so a template or renderer change shows up."""
    not_append_only = set()
    for golden in GOLDEN:
        protocol = get_protocol(golden.protocol, **golden.options)
        ends_with_assistant = cases()[golden.case]["messages"][-1]["role"] == "assistant"
        golden_text = golden.text.removesuffix("\n") if ends_with_assistant else golden.text
        if as_sampled_text(protocol, golden) != golden_text:
            not_append_only.add(golden.id)
    assert not_append_only == {
        # A turn before the last user query loses its reasoning (and its empty <think> block) on re-render.
        "qwen3__multi_turn_reasoning__gen_false",
        "qwen3__multi_turn_reasoning__gen_false__enable_thinking_false",
        "qwen3_4b_instruct_2507__multi_turn_reasoning__gen_false",
        "qwen3_4b_thinking_2507__multi_turn_reasoning__gen_false",
        "qwen3__plain_chat__gen_true",
        "qwen3__plain_chat__gen_true__enable_thinking_false",
        "qwen3_4b_thinking_2507__plain_chat__gen_true",
        # A tool-calling turn without reasoning is re-rendered without the <think> block the model wrote.
        "qwen3__single_tool_call__gen_false",
        "qwen3__single_tool_call__gen_false__enable_thinking_false",
        "qwen3__parallel_tool_calls__gen_false",
        "qwen3__parallel_tool_calls__gen_false__enable_thinking_false",
        "qwen3_4b_thinking_2507__single_tool_call__gen_false",
        "qwen3_4b_thinking_2507__parallel_tool_calls__gen_false",
        # Instruct-2507 never reasons, but its template gives the final turn an empty <think> block.
        "qwen3_4b_instruct_2507__single_tool_call__gen_false",
        "qwen3_4b_instruct_2507__parallel_tool_calls__gen_false",
    }
