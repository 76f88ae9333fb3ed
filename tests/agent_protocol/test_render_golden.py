"""The Python renderer is byte-identical to the official Qwen3-family templates on every golden render."""

from __future__ import annotations

import pytest

from agent_protocol import get_protocol
from tests.agent_protocol.golden import QWEN3_TEMPLATES, GoldenRender, cases, renders

RENDERS = renders(*QWEN3_TEMPLATES)


def test_every_qwen3_family_render_is_present() -> None:
    # 6 cases x 2 (generation prompt or not) for each of 3 templates, plus 12 enable_thinking=False variants
    assert len(RENDERS) == 48
    assert {r.template for r in RENDERS} == {"qwen3", "qwen3_4b_instruct_2507", "qwen3_4b_thinking_2507"}


@pytest.mark.parametrize("golden", RENDERS, ids=lambda g: g.id)
def test_render_matches_official_template_byte_for_byte(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    rendered = protocol.render_messages(
        case["messages"], tools=case["tools"], add_generation_prompt=golden.add_generation_prompt
    )
    assert rendered == golden.text


@pytest.mark.parametrize("golden", [r for r in RENDERS if r.add_generation_prompt], ids=lambda g: g.id)
def test_render_prompt_is_render_with_generation_prompt(golden: GoldenRender) -> None:
    case = cases()[golden.case]
    protocol = get_protocol(golden.protocol, **golden.options)
    assert protocol.render_prompt(case["messages"], tools=case["tools"]) == golden.text
    assert golden.text.endswith(protocol.generation_prompt)
