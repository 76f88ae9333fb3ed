"""Checks the chat-protocol family tests share: the Jinja-side adaptations of a conversation, the comparison of a
protocol's renders with its official template, the golden renders, and the episode checks (the text an episode
lays down, piece by piece, against the official render of the whole conversation).

Every comparison here is against the official template (an `Official` callable the family test builds on
`tests/support/hf_jinja.py`) or the golden renders, never against our own output. What a family's template does
differently is an argument (its turn-end token, how a turn is generated, the token it ended on).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import Any

import pytest

from agent_protocol import Action, ChatProtocol, MessageError, get_protocol
from tests.agent_protocol.golden import GoldenRender, cases

__all__ = [
    "Official",
    "as_vllm_passes",
    "check_feedback",
    "check_parse",
    "compare_with_jinja",
    "episode_splits",
    "episode_text",
    "golden_conversations",
    "is_episode",
    "object_arguments",
    "observations_after",
    "official_episode",
    "render_golden",
    "string_arguments",
]

#: an official render: (messages, tools, add_generation_prompt) -> text
Official = Callable[[list[dict[str, Any]], Any, bool], str]


# -- Jinja-side adaptations -----------------------------------------------------------------------------------


def as_vllm_passes(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as vLLM's chat preprocessing hands it to a template: null content as "" (bare templates
    concatenate it or print "None") and arguments given as a JSON string as the object they hold (bare templates
    would dump the string with its escapes)."""
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("content", "") is None:
            message["content"] = ""
        for call in message.get("tool_calls", []):
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """`message` (an OpenAI dict, e.g. a trajectory message's `to_openai()`) with its calls' arguments as objects,
    as a template that iterates or dumps them needs; the message itself is left as it is."""
    if "tool_calls" not in message:
        return message
    calls = [
        {**c, "function": {**c["function"], "arguments": _as_object(c["function"]["arguments"])}}
        for c in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _as_object(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def string_arguments(messages: list[dict[str, Any]], *, ensure_ascii: bool = True) -> list[dict[str, Any]]:
    """The conversation with every call's arguments as a JSON string, as OpenAI clients send them (and as a template
    that concatenates them needs); arguments already given as a string are kept."""
    out = copy.deepcopy(messages)
    for message in out:
        for call in message.get("tool_calls") or []:
            if not isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=ensure_ascii)
    return out


# -- renders against the template and the golden files ---------------------------------------------------------


def render_golden(golden: GoldenRender) -> str:
    """Our render of a golden case, with the protocol and options the golden render names."""
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    return protocol.render_messages(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt
    )


def golden_conversations(*, multi_turn: bool) -> list[tuple[list[dict[str, Any]], Any]]:
    """(messages, tools) of the golden cases; with `multi_turn`, only those that hold an assistant turn."""
    return [
        (c["messages"], c["tools"])
        for c in cases().values()
        if not multi_turn or any(m["role"] == "assistant" for m in c["messages"])
    ]


def compare_with_jinja(
    protocol: ChatProtocol,
    official: Official,
    conversations: Iterable[tuple[list[dict[str, Any]], Any]],
    *,
    refused_by: tuple[type[Exception], ...] = (),
    refusal: str | None = None,
    template_error: str | None = None,
) -> tuple[int, int]:
    """Render every conversation both ways, with and without the generation prompt; returns (compared, refused).
    Where the template raises one of `refused_by` (its own refusal), the protocol must raise a MessageError
    matching `refusal`, and the template's message must match `template_error` when given."""
    compared = refused = 0
    for index, (messages, tools) in enumerate(conversations):
        for generation in (False, True):
            try:
                expected = official(messages, tools, generation)
            except refused_by as e:
                with pytest.raises(MessageError, match=refusal):
                    protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
                if template_error is not None:
                    assert re.search(template_error, str(e)), e
                refused += 1
                continue
            actual = protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
            assert actual == expected, f"conversation {index}, tools={tools is not None}, gen={generation}"
            compared += 1
    return compared, refused


def check_parse(action: Action, content: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """A well-formed turn of a family without reasoning parsed to `content` and `calls`, with no issue."""
    assert action.issues == ()
    assert action.content == content
    assert action.reasoning_content is None
    assert [(c.name, c.arguments) for c in action.tool_calls] == calls


# -- feedback and episodes ------------------------------------------------------------------------------------


def episode_splits(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the assistant turns an episode could have generated: each follows a non-assistant message and
    is followed by at least one (tool results or a user message: the feedback)."""
    return [
        i
        for i, m in enumerate(messages)
        if m["role"] == "assistant"
        and i > 0
        and messages[i - 1]["role"] != "assistant"
        and i + 1 < len(messages)
        and messages[i + 1]["role"] != "assistant"
    ]


def observations_after(messages: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The messages between the assistant turn `turn` and the next one: the feedback after it."""
    end = next((j for j in range(turn + 1, len(messages)) if messages[j]["role"] == "assistant"), len(messages))
    return messages[turn + 1 : end]


def check_feedback(
    protocol: ChatProtocol, official: Official, messages: list[dict[str, Any]], tools: Any, turn: int, *, turn_end: str
) -> bool:
    """The feedback after the assistant turn `turn` continues the official render of the conversation up to it;
    returns whether the template is append-only there (False only where the family documents a seam). The
    template ends a turn with `turn_end` and a newline; the model stops right after `turn_end`."""
    observations = observations_after(messages, turn)
    before = official(messages[: turn + 1], tools, False)
    after = official(messages[: turn + 1] + observations, tools, True)
    assert before.endswith(turn_end + "\n")
    generated_part = before.removesuffix("\n")
    feedback = protocol.render_feedback(observations)
    if after.startswith(generated_part):
        assert generated_part + feedback == after
        return True
    assert after.endswith(feedback.removeprefix("\n"))
    return False


def is_episode(messages: list[dict[str, Any]]) -> bool:
    """Whether an episode can produce `messages`: a prompt before the first assistant turn (if any), and
    feedback between every two turns."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return (not turns or turns[0] > 0) and all(b > a + 1 for a, b in pairwise(turns))


def episode_text(
    protocol: ChatProtocol,
    messages: list[dict[str, Any]],
    tools: Any,
    *,
    generate: Callable[[list[dict[str, Any]], int], str] | None = None,
    ended_by: Callable[[str], str] | None = None,
) -> str:
    """What an episode's transcript holds as text: the first prompt, each assistant turn as generated
    (`generate(messages, index)`, by default `render_generation`), each feedback (told the token the turn
    ended on, `ended_by(generated)`, for a family whose feedback depends on it)."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    first = turns[0] if turns else len(messages)
    text = protocol.render_prompt(messages[:first], tools=tools)
    for position, index in enumerate(turns):
        generated = generate(messages, index) if generate else protocol.render_generation(messages[index])
        text += generated
        end = turns[position + 1] if position + 1 < len(turns) else len(messages)
        if end > index + 1:
            observations = messages[index + 1 : end]
            if ended_by is None:
                text += protocol.render_feedback(observations)
            else:
                text += protocol.render_feedback(observations, ended_by=ended_by(generated))
    return text


def official_episode(official: Official, messages: list[dict[str, Any]], tools: Any) -> str:
    """The official render an episode's transcript is compared with, for a template whose turns end with a
    newline after the end token: ending on a generated turn (no newline after it) or on the next generation
    prompt."""
    if messages[-1]["role"] == "assistant":
        return official(messages, tools, False).removesuffix("\n")
    return official(messages, tools, True)
