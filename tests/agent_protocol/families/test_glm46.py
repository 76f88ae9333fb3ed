"""GLM-4.6 (`glm-4.6`, option `enable_thinking`): renders, detection, feedback and token-in-token-out.

Reference: `tests/data/golden/templates/glm4.6.jinja`, llama.cpp's copy of zai-org/GLM-4.6's template (see
SOURCES.md), and its golden renders, made from it. It renders every conversation `coerce_messages` passes
exactly as GLM-4.5's does, so `glm-4.6` is GLM-4.5's protocol under its own name; these tests hold it to the
GLM-4.6 template itself. The parser and the seams are GLM-4.5's (tests/agent_protocol/families/test_glm45.py,
which also runs the typed parser for both names). As there, the Jinja side gets Hugging Face's `tojson`, which
takes `ensure_ascii`.
"""

from __future__ import annotations

import random
from functools import cache
from itertools import pairwise
from typing import Any

import jinja2
import pytest

from agent_protocol import get_protocol
from agent_protocol.protocol_detection import protocol_for_template
from agent_protocol.protocols.glm45 import Glm46Protocol
from tests.agent_protocol.families.test_glm45 import (
    CONVERSATIONS,
    OBSERVATION,
    ROLE_TOKENS,
    USER,
    VARIANTS,
    _episode,
    _hf_tojson,
    _role_token_ending,
    _tools,
    calculator_call,
    final_answer,
    glm_byte_tokenizer,
)
from tests.agent_protocol.golden import GoldenRender, cases, renders
from tests.support.calculator_episode import run_calculator_episode
from tests.support.family_checks import (
    compare_with_jinja,
    episode_text,
    object_arguments,
    render_golden,
    string_arguments,
)
from tests.support.hf_jinja import TEMPLATES, official_template

STEM = "glm4.6"
#: what the golden renders passed as special tokens (GLM-4.5's: the same tokenizer; the template reads none)
SPECIAL_TOKENS = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
RENDERS = renders(STEM)


@cache
def _template() -> jinja2.Template:
    env = official_template("glm4.5").environment.overlay()
    env.filters = {**env.filters, "tojson": _hf_tojson}
    return env.from_string((TEMPLATES / f"{STEM}.jinja").read_text(encoding="utf-8"))


def official(
    messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = False, **kwargs: Any
) -> str:
    """The GLM-4.6 template, rendered the Hugging Face way."""
    return _template().render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **SPECIAL_TOKENS, **kwargs
    )


def test_every_golden_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) x 2 (default, enable_thinking=False); the template refuses none
    assert len(RENDERS) == 24 and not any(r.refused for r in RENDERS)
    assert {r.protocol for r in RENDERS} == {"glm-4.6"}


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_golden_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    assert render_golden(golden) == golden.text
    kwargs = {"enable_thinking": False} if golden.options else {}
    assert (
        official(case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt, **kwargs)
        == golden.text
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_render_equals_official_jinja_on_generated_conversations(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.6", **options)

    def official_of(messages: list[dict[str, Any]], tools: Any, generation: bool) -> str:
        return official(
            [object_arguments(m) for m in messages], tools=tools, add_generation_prompt=generation, **options
        )

    conversations = [(m, _tools(random.Random(index))) for index, m in enumerate(CONVERSATIONS)]
    assert compare_with_jinja(protocol, official_of, conversations) == (2 * len(CONVERSATIONS), 0)
    as_strings = [(string_arguments(m), tools) for m, tools in conversations]
    assert compare_with_jinja(protocol, official_of, as_strings) == (2 * len(CONVERSATIONS), 0)
    assert 2 * len(CONVERSATIONS) >= 300


def test_null_arguments_render_as_no_arguments_in_this_copy() -> None:
    # The one template difference from GLM-4.5 that reaches the bytes: llama.cpp's copy writes
    # `tc.arguments or {}`, so a call with null arguments renders with none. Our messages never hold null
    # arguments (`coerce_messages` makes them {}), which renders the same.
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "now", "arguments": None}}]}
    messages = [{"role": "user", "content": "q"}, call]
    empty = [{"role": "user", "content": "q"}, {**call, "tool_calls": [{"function": {"name": "now", "arguments": {}}}]}]
    assert official(messages) == official(empty) == get_protocol("glm-4.6").render_messages(empty)


def test_detection_tells_glm46_from_glm45_both_ways() -> None:
    glm46 = (TEMPLATES / "glm4.6.jinja").read_text(encoding="utf-8")
    glm45 = (TEMPLATES / "glm4.5.jinja").read_text(encoding="utf-8")
    assert protocol_for_template(glm46) == "glm-4.6"
    assert protocol_for_template(glm45) == "glm-4.5"
    # the same template with llama.cpp's other adaptation of the arguments line (ik_llama.cpp's copy) too
    other_copy = glm46.replace("{% set _args = tc.arguments or {} %}", "{% set _args = tc.arguments %}")
    assert protocol_for_template(other_copy) == "glm-4.6"
    assert isinstance(get_protocol("glm-4.6"), Glm46Protocol) and get_protocol("glm-4.6").name == "glm-4.6"


def test_refusal_names_the_template() -> None:
    from agent_protocol import MessageError

    with pytest.raises(MessageError, match=r"official GLM-4\.6 template"):
        get_protocol("glm-4.6").render_messages([{"role": "user", "content": "q"}, {"role": "tool", "content": None}])


def _expected_transcript(messages: list[dict[str, Any]], tools: Any, options: dict[str, Any]) -> str:
    """The GLM-4.6 render of `messages` plus the role tokens the turns sampled where the render has another one
    or none (the seams pinned for GLM-4.5 in test_glm45.py, the same here)."""
    full = official(messages, tools=tools, add_generation_prompt=messages[-1]["role"] != "assistant", **options)
    out, cursor = "", 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        sampled = OBSERVATION if message.get("tool_calls") else USER
        before = official(messages[: index + 1], tools=tools, **options)
        assert full.startswith(before)
        if index + 1 == len(messages):
            out, cursor = out + full[cursor:] + sampled, len(full)
        elif ROLE_TOKENS[messages[index + 1]["role"]] != sampled:
            out, cursor = out + full[cursor : len(before)] + sampled, len(before)
    return out + full[cursor:]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_prompt_generations_and_feedback_concatenate_to_the_official_render(variant: str) -> None:
    options = VARIANTS[variant]
    protocol = get_protocol("glm-4.6", **options)
    seams = 0
    for seed in range(150):
        rng = random.Random(seed)
        messages = _episode(rng, thinking=not options)
        tools = _tools(rng)
        text = episode_text(protocol, messages, tools, ended_by=_role_token_ending)
        assert text == _expected_transcript(messages, tools, options), seed
        seams += sum(
            m["role"] == "assistant" and ROLE_TOKENS[n["role"]] != (OBSERVATION if m.get("tool_calls") else USER)
            for m, n in pairwise(messages)
        )
    assert seams >= 15


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_session_is_token_in_token_out(variant: str) -> None:
    CalculatorTool = pytest.importorskip("agent_env").CalculatorTool  # skipped in agent-protocol alone

    options = VARIANTS[variant]
    first, second = calculator_call("17 * 23"), final_answer("The answer is 391.")
    if options:  # thinking off: the prompt holds the empty block, the model writes no reasoning
        first, second = first.split("</think>", 1)[1], second.split("</think>", 1)[1]
    episode = run_calculator_episode(
        get_protocol("glm-4.6", **options), glm_byte_tokenizer(), [first, second], rewards="none"
    )
    trajectory = episode.result.trajectory
    (segment,) = trajectory.segments
    messages = [object_arguments(m.to_openai()) for m in trajectory.messages]
    official_text = official(messages, tools=[CalculatorTool().spec.to_openai()], **options)
    tokenizer = glm_byte_tokenizer()
    # the official render plus the one seam at the end: the last turn's sampled <|user|>
    assert segment.ids == tokenizer.encode(official_text + USER)
    assert [segment.ids[a:b] for a, b in segment.action_ranges] == [tokenizer.encode(first), tokenizer.encode(second)]
    assert episode.engine.calls[1] == segment.ids[: segment.action_ranges[1][0]]
