"""Token-in-token-out, with the real Qwen3 tokenizer, on every golden multi-turn case.

The transcript is built the way an episode builds it: the first prompt rendered and tokenized once, each
assistant turn appended as its generated token ids, each feedback delta tokenized on its own. Then:

1. Everything that is not a generated turn is byte-identical to the official template's render.
2. Where the template is append-only for the conversation, the ids equal the golden token ids of the
   official full render, token for token.
3. Where it is not (see README "What the transcript holds"), the transcript holds each turn as generated,
   and re-tokenizing the text gives the same ids, id for id, except at the documented seam where the
   prompt's `<think>\\n` meets a generated `\\n</think>`: there the transcript holds `\\n`, `\\n`, `</think>`
   and the re-tokenized text `\\n\\n`, `</think>`.
4. Every generated turn holds exactly the ids of the generation, and the loss mask and action ranges are
   exactly the token spans of the generated turns in the text (found from the text, not from the transcript).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_protocol import ChatProtocol, HFTokenizer, TokenTranscript, get_protocol
from tests.agent_protocol.golden import QWEN3_TEMPLATES, GoldenRender, cases, renders

IM_START = "<|im_start|>"
NEWLINE, DOUBLE_NEWLINE, THINK_END = 198, 271, 151668


def _golden_for_tito() -> list[GoldenRender]:
    """One golden render per (template, variant, case): the one a finished episode would produce."""
    chosen = []
    for golden in renders(*QWEN3_TEMPLATES):
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
    return sampled_text_and_turns(protocol, golden)[0]


def sampled_text_and_turns(protocol: ChatProtocol, golden: GoldenRender) -> tuple[str, list[tuple[int, int]]]:
    """`as_sampled_text`, and the character span of each generated turn in it."""
    messages = cases()[golden.case]["messages"]
    generated = [protocol.render_generation(m) for m in messages if m["role"] == "assistant"]
    opener = protocol.generation_prompt.removeprefix(IM_START)
    blocks = golden.text.split(IM_START)
    text, turns = blocks[0], []
    for block in blocks[1:]:
        text += IM_START
        if block.startswith("assistant\n") and generated:  # a generated turn, not the final generation prompt
            turn = generated.pop(0)
            start = len(text) + len(opener)
            turns.append((start, start + len(turn)))
            block = opener + turn + "\n"
        text += block
    return (text.removesuffix("\n") if messages[-1]["role"] == "assistant" else text), turns


def merge_seams(ids: list[int]) -> list[int]:
    """`ids` with each documented seam (`\\n`, `\\n`, `</think>`) as one tokenization of the text gives it."""
    out: list[int] = []
    for token in ids:
        if token == THINK_END and out[-2:] == [NEWLINE, NEWLINE]:
            out[-2:] = [DOUBLE_NEWLINE]
        out.append(token)
    return out


def token_index(tokenizer: HFTokenizer, ids: list[int], text: str, char: int) -> int:
    """The k for which `ids[:k]` decodes to exactly `text[:char]`; fails when no token boundary falls there."""
    low, high = 0, len(ids)
    while low < high:  # the first k whose decoded prefix reaches `char` characters
        middle = (low + high) // 2
        if len(tokenizer.decode(ids[:middle])) < char:
            low = middle + 1
        else:
            high = middle
    assert tokenizer.decode(ids[:low]) == text[:char], f"no token boundary at character {char}"
    return low


def check_tito(golden: GoldenRender, transcript: TokenTranscript, tokenizer: HFTokenizer) -> None:
    """Points 1-4 of the module docstring, for one golden case and the transcript an episode built for it."""
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    expected_text, turns = sampled_text_and_turns(protocol, golden)

    # 1. Outside the generated turns, every byte is the official render's.
    assert tokenizer.decode(transcript.ids) == expected_text

    golden_ids = golden.ids[:-1] if case["messages"][-1]["role"] == "assistant" else golden.ids
    golden_text = golden.text.removesuffix("\n") if case["messages"][-1]["role"] == "assistant" else golden.text
    if expected_text == golden_text:
        # 2. Append-only: token for token the tokenization of the official full render.
        assert transcript.ids == golden_ids
    else:
        # 3. Not append-only: the turns are kept as generated; re-tokenizing the text gives the same ids except
        # at the documented <think>\n|\n</think> seam of the forced-thinking prompt.
        assert merge_seams(transcript.ids) == tokenizer.encode(expected_text)

    # 4. Each generated turn is its generation's ids; the loss mask and the action ranges are exactly the turns.
    actions = [m for m in case["messages"] if m["role"] == "assistant"]
    ids = transcript.ids
    ranges = [
        (token_index(tokenizer, ids, expected_text, a), token_index(tokenizer, ids, expected_text, b)) for a, b in turns
    ]
    assert transcript.action_ranges == ranges
    for (start, end), message in zip(ranges, actions, strict=True):
        assert ids[start:end] == tokenizer.encode(protocol.render_generation(message))
    expected_mask = [0] * len(ids)
    for start, end in ranges:
        expected_mask[start:end] = [1] * (end - start)
    assert transcript.loss_mask == expected_mask


def test_every_golden_case_is_checked() -> None:
    assert len(GOLDEN) == 24  # 6 cases x (3 templates + the enable_thinking=False variant)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_transcript_matches_the_official_render(golden: GoldenRender, tokenizer: HFTokenizer) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    check_tito(golden, build_transcript(protocol, tokenizer, case["messages"], case["tools"]), tokenizer)


def test_the_seam_cases_are_checked_id_for_id(tokenizer: HFTokenizer) -> None:
    """The seam is where the README says, and the check compares ids there, not counts: a transcript with the same
    text but one prompt token split in two fails at the id comparison; one loss-mask bit moved fails too."""
    with_seam = set()
    for golden in GOLDEN:
        case = cases()[golden.case]
        transcript = build_transcript(
            get_protocol(golden.protocol, **golden.options), tokenizer, case["messages"], case["tools"]
        )
        if merge_seams(transcript.ids) != transcript.ids:
            with_seam.add(golden.id)
    assert with_seam == {  # the forced-thinking prompt of Thinking-2507 ends in <think>\n
        "qwen3_4b_thinking_2507__plain_chat__gen_true",
        "qwen3_4b_thinking_2507__single_tool_call__gen_false",
        "qwen3_4b_thinking_2507__parallel_tool_calls__gen_false",
    }

    golden = next(g for g in GOLDEN if g.id == "qwen3_4b_thinking_2507__single_tool_call__gen_false")
    case = cases()[golden.case]
    transcript = build_transcript(
        get_protocol(golden.protocol, **golden.options), tokenizer, case["messages"], case["tools"]
    )
    check_tito(golden, transcript, tokenizer)

    you = transcript.ids.index(tokenizer.encode("You")[0])  # in the system prompt
    split = TokenTranscript()  # "You" as "Y", "ou": the same text and one token more, every later id shifted
    for span in transcript.spans:
        ids = transcript.ids[span.start : span.end]
        if span.kind == "prompt":
            split.append_prompt(ids[:you] + tokenizer.encode("Y") + tokenizer.encode("ou") + ids[you + 1 :])
        elif span.kind == "action":
            split.append_action(ids)
        else:
            split.append_observation(ids)
    assert tokenizer.decode(split.ids) == tokenizer.decode(transcript.ids)
    with pytest.raises(AssertionError, match="At index 3 diff"):  # the ids, not the text or the count
        check_tito(golden, split, tokenizer)

    moved = TokenTranscript.from_record(transcript.record())
    moved.loss_mask[transcript.action_ranges[0][1]] = 1  # the first token after the turn, trained as if generated
    with pytest.raises(AssertionError):
        check_tito(golden, moved, tokenizer)


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


def test_a_float_id_is_refused_and_the_transcript_stays_as_it_was() -> None:
    transcript = TokenTranscript()
    transcript.append_prompt([151644, 872, 198])
    transcript.append_observation([True, 2])  # bools are ints; they come out as 1
    with pytest.raises(TypeError):
        transcript.append_observation([5, 3.0])  # type: ignore[list-item]  # a bug upstream: refused, not truncated
    assert transcript.ids == [151644, 872, 198, 1, 2]  # nothing of the refused append is kept
    assert all(type(i) is int for i in transcript.ids)
    assert len(transcript.loss_mask) == len(transcript.logprobs) == len(transcript.ids) == transcript.spans[-1].end


def test_numpy_and_torch_ids_are_kept_as_plain_ints() -> None:
    np = pytest.importorskip("numpy")  # agent-protocol alone installs neither
    torch = pytest.importorskip("torch")
    transcript = TokenTranscript()
    transcript.append_prompt(np.array([151644, 872, 198], dtype=np.int64))
    transcript.append_action(torch.tensor([9707, 151645]), logprobs=[-0.5, -0.1])
    assert transcript.ids == [151644, 872, 198, 9707, 151645]
    assert all(type(i) is int for i in transcript.ids)
