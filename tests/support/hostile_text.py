"""Hypothesis strategies for hostile model output, shared by the parser fuzz tests: what degenerate RL generations
are made of (tags, JSON fragments, deep nesting, huge numbers, surrogates, NUL bytes, megabyte strings). CI runs
`AGENT_FUZZ_EXAMPLES` examples per test (default 200); `AGENT_FUZZ_RANDOM=1` explores new seeds."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = ["BASE_TAGS", "EXAMPLES", "FUZZ", "hostile_piece"]

#: Qwen's tags; a fuzz test passes every family's (`hostile_piece(tags)`)
BASE_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>", "<|endoftext|>", "<|im_start|>")

EXAMPLES = int(os.environ.get("AGENT_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("AGENT_FUZZ_RANDOM") != "1",  # CI is repeatable; set 1 to explore new seeds
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

JSON_BITS = ['{"name": "calculator", "arguments": ', '{"name": ', '"arguments"', "{", "}", "[", "]", ":", ",",
             '"', "\\", "null", "true", "1e999", "-0", "NaN", "Infinity", '"x"', "\n", " "]  # fmt: skip


SIZES = st.sampled_from([1, 2, 99, 100, 101, 150, 999, 1500, 3000, 20000]) | st.integers(1, 3000)
DIGITS = st.sampled_from([1, 19, 20, 4300, 4301, 5000, 20000]) | st.integers(1, 6000)


@st.composite
def hostile_piece(draw: st.DrawFn, tags: Sequence[str] = BASE_TAGS) -> str:
    kind = draw(st.integers(0, 9))
    n = draw(SIZES)
    match kind:
        case 0:
            return draw(st.sampled_from(list(tags)))
        case 1:
            return draw(st.sampled_from(JSON_BITS))
        case 2:  # deep nesting, closed or not
            opener = draw(st.sampled_from(["[", '{"a":', '[{"b":']))
            return opener * n + draw(st.sampled_from(["", "1" + "]" * n, "}" * n]))
        case 3:  # a number past CPython's 4,300-digit conversion limit, or just long
            return draw(st.sampled_from(["", "-", "0.", "1e"])) + "9" * draw(DIGITS)
        case 4:  # surrogate escapes (valid JSON, invalid text) and raw lone surrogates
            return draw(st.sampled_from(['"\\ud800"', '"\\udfff\\ud83d"', "\\ud834", chr(0xD800), chr(0xDFFF)]))
        case 5:
            return "\x00" * draw(st.integers(1, 8))
        case 6:  # a megabyte of one character, sometimes a bracket
            return draw(st.sampled_from(["a", "[", "{", '"', "<", " "])) * draw(st.sampled_from([1, 1 << 10, 1 << 20]))
        case 7:  # a well-formed call, so that the mix often holds real ones too
            args = draw(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3))
            payload = json.dumps({"name": "calculator", "arguments": args})
            return f"<tool_call>\n{payload}\n</tool_call>"
        case 8:  # arguments as a string holding hostile JSON
            inner = draw(st.sampled_from(["[" * n, "9" * (4000 + n), '{"a": "\\ud800"}', "{" * n + "}" * n]))
            return json.dumps({"name": "calculator", "arguments": inner})
        case _:
            return draw(st.text(max_size=50))
