"""What lets a smoke mode run a recipe in any model family's chat format (`--protocol gpt-oss`, `llama3.1`, ...):
the family's tokenizer, a reader that finds a user message and the tool results in a decoded prompt of that
family, and a scripted engine whose policy answers with an assistant *message* that the family's own protocol
writes as the model would generate it (`ChatProtocol.render_generation`).

The reader learns where a family puts a user message and a tool result from the family's own renderer: it renders
a probe conversation with a marker as the content and keeps the few characters on either side of the marker. So
the policy is still given the prompt ids and nothing else, and nothing here knows any family's format.

Tokenizers: the family's own where tests/data has it (Qwen: rebuilt offline; gpt-oss, Llama 3, DeepSeek-V3: the
official files). GLM-4.5 and Mistral have none here; their smoke runs on the Qwen3 tokenizer with the family's
control tokens added as special tokens, a stand-in that keeps each control token one id, as in the real
vocabulary, and is said so when used.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent_protocol import ChatProtocol, HFTokenizer, Message, MessageError, TemplateGapWarning, Tokenizer, ToolSpec
from agent_runtime import ScriptedEngine

__all__ = ["FamilyPrompt", "FamilyReader", "family_engine", "family_tokenizer", "require_tool_format"]

_MARK: Final = 'MARK"7Q'  # a quote, to see whether the family JSON-escapes the content it embeds
_CALL_ID: Final = "abcdefghi"  # 9 characters: Mistral's templates refuse other call ids
_LISTING: Final = 200  # a user edge longer than this holds a tool listing (see FamilyReader)
_EDGE: Final = 24  # characters kept on each side of the marker: enough to tell a user turn from a tool result
#: families whose model writes call ids in a fixed form that their parser reads the function's name from
_MODEL_CALL_IDS: Final = {"kimi-k2": "functions.{name}:{index}", "kimi-k2-thinking": "functions.{name}:{index}"}
_SPECIAL: Final = re.compile(r"<\|[^|>]*\|>|<｜[^｜]*｜>|\[/?[A-Z_]+\]|</?[a-z_]+>")

#: families whose tokenizer is in tests/data/tokenizers (key of tests/support/family_tokenizers.SHA256)
_OWN_TOKENIZERS: Final = {
    "gpt-oss": "gpt_oss",
    "llama3.1": "llama3.1",
    "llama3.2": "llama3.1",
    "deepseek-v3.1": "deepseek_v3",
    "deepseek-v3.1-vllm-tools": "deepseek_v3",
    "deepseek-v3.2": "deepseek_v3",
    "gemma3": "gemma3",
    "gemma3-vllm-pythonic": "gemma3",
}


def family_tokenizer(protocol: ChatProtocol) -> tuple[Tokenizer, str]:
    """The tokenizer the smoke runs `protocol` on, and a word on where it comes from."""
    from tests.support.family_tokenizers import load_family_tokenizer
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    if protocol.name in _OWN_TOKENIZERS:
        return load_family_tokenizer(_OWN_TOKENIZERS[protocol.name]), f"the official {protocol.name} tokenizer"
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
    if protocol.name.startswith("qwen"):
        return tokenizer, "the official Qwen3 tokenizer"
    added = sorted({t for t in (*protocol.stop_texts, *protocol.turn_end_texts) if t} | _controls(protocol))
    tokenizer.backend.add_special_tokens(added)
    return tokenizer, f"a stand-in: the Qwen3 tokenizer with {protocol.name}'s {len(added)} control tokens added"


def _controls(protocol: ChatProtocol) -> set[str]:
    """The control tokens a family's renders use (as found in a probe render)."""
    call = {"id": "abcdefghi", "function": {"name": "f", "arguments": {}}}
    with warnings.catch_warnings():  # a probe: what a template leaves out (kimi-k2's calls) is not this one's concern
        warnings.simplefilter("ignore", TemplateGapWarning)
        probe = protocol.render_messages(
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "abcdefghi", "name": "f", "content": "r"},
            ],
            tools=[
                {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
            ],
            add_generation_prompt=True,
        )
    return set(_SPECIAL.findall(probe))


def _edges(text: str, name: str, *, whole_after: bool = False) -> tuple[str, str, bool]:
    """The text around the marker in `text`: before it, from the last control token on (never the tool's name);
    after it, up to `_EDGE` characters before any call id, or (`whole_after`) all of it; and whether the content
    was JSON-escaped."""
    escaped = _MARK.replace('"', '\\"') in text
    before, _, after = text.partition(_MARK.replace('"', '\\"') if escaped else _MARK)
    controls = list(_SPECIAL.finditer(before))
    # a bare control token before a tool result tells no role from another (Kimi's `<|im_middle|>`): then the
    # result's edge starts at the one before it
    bare = not whole_after and len(controls) > 1 and controls[-1].end() == len(before)
    before = before[controls[-2 if bare else -1].start() :] if controls else before[-_EDGE:]
    before = before.rsplit(name, 1)[-1].rsplit(_CALL_ID, 1)[-1]  # a result headed by its call id (Kimi)
    after = after if whole_after else after.split(_CALL_ID, 1)[0][:_EDGE]  # the call id varies: never part of it
    return before, after, escaped


@dataclass(frozen=True)
class FamilyPrompt:
    """A decoded prompt of any family, as a policy sees it: the question and the tool results in it."""

    question: str
    results: tuple[str, ...]

    def tool_results(self) -> list[str]:
        return list(self.results)


class FamilyReader:
    """Reads `FamilyPrompt`s of `protocol`'s family (see the module docstring)."""

    def __init__(self, protocol: ChatProtocol, tools: Sequence[ToolSpec]) -> None:
        user = protocol.render_messages(
            [{"role": "user", "content": _MARK}], tools=list(tools), add_generation_prompt=True
        )
        ended_by = protocol.turn_end_texts[0] if protocol.turn_end_texts else None
        tool = protocol.render_feedback(
            [{"role": "tool", "tool_call_id": _CALL_ID, "name": "probe_tool", "content": _MARK}], ended_by=ended_by
        )
        before, after, escaped = _edges(user, "probe_tool", whole_after=True)
        if len(before) > _LISTING:  # the tool listing opens the user's turn, after the system text in the same
            before = before[-_EDGE:]  # turn (gemma3-vllm-pythonic): the question follows the listing's end
        self._user = (before, after, escaped)
        self._tool = self._pattern(*_edges(tool, "probe_tool"))

    @staticmethod
    def _pattern(before: str, after: str, escaped: bool) -> tuple[re.Pattern[str], bool]:
        return re.compile(re.escape(before) + "(.*?)" + re.escape(after), re.S), escaped

    @staticmethod
    def _read(found: str, escaped: bool) -> str:
        return str(json.loads(f'"{found}"')) if escaped else found

    def __call__(self, text: str) -> FamilyPrompt:
        (before, after, user_escaped), (tool, tool_escaped) = self._user, self._tool
        # The question ends where the first assistant turn opens, and starts at the user edge just before that
        # (the edge can recur earlier: Llama lists the tools in the first user message, each ending alike).
        end = text.find(after)
        start = text.rfind(before, 0, end) if end >= 0 else -1
        question = self._read(text[start + len(before) : end], user_escaped) if start >= 0 else ""
        results = tuple(self._read(m, tool_escaped) for m in tool.findall(text))
        return FamilyPrompt(question=question, results=results)


Turn = Mapping[str, Any]


def require_tool_format(protocol: ChatProtocol, tools: Sequence[ToolSpec]) -> None:
    """Refuse, before any episode runs, a family with no tool format (qwen2.5-vl's and gemma3's templates): the
    smoke's agent calls tools. A family that refuses a generated call or the tool list has none. The probe renders
    on a copy, with template-gap warnings silenced (a family warns once per protocol object: the episodes' own
    renders still warn), so a family that only leaves the tool list out (deepseek-v3.1) still runs."""
    probe = copy.copy(protocol)
    call = {"id": _CALL_ID, "type": "function", "function": {"name": tools[0].name if tools else "f", "arguments": {}}}
    try:
        probe.render_generation({"role": "assistant", "content": "", "tool_calls": [call]})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TemplateGapWarning)
            probe.render_messages([{"role": "user", "content": "q"}], tools=list(tools), add_generation_prompt=True)
    except MessageError as e:
        raise MessageError(
            "protocol", f"{protocol.name} renders no tool format, and this smoke's agent calls tools ({e})"
        ) from e


def family_engine(
    policy: Callable[[FamilyPrompt], Turn], protocol: ChatProtocol, tokenizer: Tokenizer, tools: Sequence[ToolSpec]
) -> ScriptedEngine:
    """A `ScriptedEngine` whose policy reads each prompt with a `FamilyReader` and answers with an assistant
    message (an OpenAI dict), written by `protocol` the way the model generates it and tokenized by `tokenizer`."""
    require_tool_format(protocol, tools)
    read = FamilyReader(protocol, tools)

    def answer(prompt_ids: Sequence[int]) -> str:
        turn = policy(read(tokenizer.decode(prompt_ids)))
        if protocol.name in _MODEL_CALL_IDS:  # the model writes its call ids in its own form
            calls = [{**c, "id": _MODEL_CALL_IDS[protocol.name].format(name=c["function"]["name"], index=k)}
                     for k, c in enumerate(turn.get("tool_calls", []))]  # fmt: skip
            turn = {**turn, "tool_calls": calls} if calls else turn
        return protocol.render_generation(Message.from_openai({"role": "assistant", **turn}))

    stops = [i for t in protocol.stop_texts if (i := tokenizer.token_to_id(t)) is not None]
    return ScriptedEngine(tokenizer, policy=answer, stop_token_ids=stops)
