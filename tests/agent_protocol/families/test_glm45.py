"""GLM-4.5 (`glm-4.5`, option `enable_thinking`): renders, parser, feedback seams and token-in-token-out.

Reference: the official template `tests/data/golden/templates/glm4.5.jinja` (typed in by hand from a GGUF log;
see SOURCES.md) and its golden renders. One adaptation on the Jinja side, the same for every render here: the
template calls `tojson(ensure_ascii=False)`, which Hugging Face's `tojson` accepts (`ensure_ascii` is one of its
parameters) and `tests/support/hf_jinja.py`'s filter does not, so `official` renders the template with a
`tojson` that takes it. Tool-call arguments go to the Jinja side as objects (the template iterates
`arguments.items()`); our side also gets them as JSON strings, which `coerce_messages` decodes.
"""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import jinja2
import pytest

from agent_protocol import MessageError, get_protocol
from agent_protocol.protocols.glm45 import Glm45Protocol
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.hf_jinja import TEMPLATES, official_template, special_tokens
from tests.support.tool_shapes import TOOL_SHAPES

STEM = "glm4.5"
OBSERVATION, USER, SYSTEM, ENDOFTEXT = "<|observation|>", "<|user|>", "<|system|>", "<|endoftext|>"
VARIANTS: dict[str, dict[str, Any]] = {"thinking": {}, "no_thinking": {"enable_thinking": False}}


def _hf_tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson` filter, with its `ensure_ascii` parameter."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@cache
def _template() -> jinja2.Template:
    env = official_template(STEM).environment.overlay()
    env.filters = {**env.filters, "tojson": _hf_tojson}  # a new dict: hf_jinja's environment is left as it is
    return env.from_string((TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8"))


def official(
    messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = False, **kwargs: Any
) -> str:
    """The official GLM-4.5 template, rendered the Hugging Face way (see the module docstring)."""
    return _template().render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **special_tokens(STEM), **kwargs
    )


def _case(golden: GoldenRender) -> dict[str, Any]:
    return dict(cases()[golden.case])


RENDERS = renders(STEM)


# -- render --------------------------------------------------------------------------------------------------


def test_every_golden_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) x 2 (default, enable_thinking=False); the template refuses none
    assert len(RENDERS) == 24
    assert not any(r.refused for r in RENDERS)


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_golden_byte_for_byte(golden: GoldenRender) -> None:
    case = _case(golden)
    protocol = get_protocol(golden.protocol, **golden.options)
    rendered = protocol.render_messages(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt
    )
    assert rendered == golden.text
    # and the adapted Jinja renders the golden bytes too, so comparing against it below is comparing to them
    kwargs = {"enable_thinking": False} if golden.options else {}
    assert (
        official(case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt, **kwargs)
        == golden.text
    )


TEXTS = [
    "",
    "Hi",
    "\n",
    "  spaces  ",
    "\nleading newline",
    "trailing newline\n",
    "two\n\nlines",
    "émoji 🦙 and 中文",
    "<think>inline reasoning</think>after",
    "<think>\nr\n</think>\n\nanswer",
    "no open tag</think>rest",
    "ends with /nothink",
    "/nothink",
    "<tool_call>typed by the user</tool_call>",
    '{"json": "looking"}',
]
VALUES: list[Any] = [
    "Paris",
    "",
    "  padded  ",
    "é 中文\nnewline",
    "true",
    "42",
    42,
    -1.5,
    True,
    False,
    None,
    [1, "a", None],
    {"nested": {"k": [1, 2]}, "é": "ü"},
    [],
    {},
]


def _arguments(rng: random.Random) -> dict[str, Any]:
    return {rng.choice(["q", "city", "n", "é", "a b"]): rng.choice(VALUES) for _ in range(rng.randint(0, 3))}


def _call(rng: random.Random, k: int) -> dict[str, Any]:
    return {
        "id": f"c{k}",
        "type": "function",
        "function": {"name": rng.choice(["lookup", "weather", "now"]), "arguments": _arguments(rng)},
    }


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    """Any mix of roles, contents and calls the template takes (null content included: it prints "None")."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.35:
            messages.append({"role": "user", "content": rng.choice([*TEXTS, None])})
        elif roll < 0.8:
            message: dict[str, Any] = {"role": "assistant", "content": rng.choice([*TEXTS, None])}
            if rng.random() < 0.5:
                message["reasoning_content"] = rng.choice(TEXTS)
            calls = rng.randint(0, 2) if rng.random() < 0.5 else 0
            if calls:
                message["tool_calls"] = [_call(rng, k) for k in range(calls)]
            messages.append(message)
            for k in range(calls):
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": rng.choice(TEXTS)})
        elif roll < 0.9:
            messages.append({"role": "tool", "tool_call_id": "x", "content": rng.choice(TEXTS)})
        else:
            messages.append({"role": "system", "content": rng.choice(TEXTS)})
    return messages


def _with_string_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same conversation with every call's arguments as a JSON string, as OpenAI clients send them."""
    out = []
    for message in messages:
        if "tool_calls" in message:
            calls = [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


CONVERSATIONS = [_conversation(random.Random(seed)) for seed in range(160)]


def _tools(rng: random.Random) -> list[dict[str, Any]] | None:
    return rng.choice([None, [], TOOL_SHAPES, rng.sample(TOOL_SHAPES, 2), [TOOL_SHAPES[3]]])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_render_equals_official_jinja_on_generated_conversations(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.5", **options)
    compared = 0
    for index, messages in enumerate(CONVERSATIONS):
        tools = _tools(random.Random(index))
        for generation in (False, True):
            expected = official(messages, tools=tools, add_generation_prompt=generation, **options)
            ours = protocol.render_messages(messages, tools=tools, add_generation_prompt=generation)
            assert ours == expected, f"conversation {index}, gen={generation}"
            strings = protocol.render_messages(
                _with_string_arguments(messages), tools=tools, add_generation_prompt=generation
            )
            assert strings == expected, f"conversation {index} with string arguments, gen={generation}"
            compared += 1
    assert compared == 2 * len(CONVERSATIONS) >= 300
    assert sum(1 for m in CONVERSATIONS if any("tool_calls" in x for x in m)) >= 50


def test_tool_message_with_null_content_is_refused_as_the_template_fails_on_it() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "content": None}]
    with pytest.raises(TypeError):  # the template iterates the null content
        official(messages)
    with pytest.raises(MessageError, match=r"messages\[1\]\.content.*official GLM-4.5 template"):
        get_protocol("glm-4.5").render_messages(messages)


def test_options_and_registry() -> None:
    assert isinstance(get_protocol("glm-4.5"), Glm45Protocol)
    with pytest.raises(TypeError, match="enable_thinking"):
        get_protocol("glm-4.5", thinking=True)
    assert get_protocol("glm-4.5").generation_prompt == "<|assistant|>"
    assert get_protocol("glm-4.5", enable_thinking=False).generation_prompt == "<|assistant|>\n<think></think>"
