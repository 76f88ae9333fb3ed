"""`check_json_body`'s own costs and edges: the shape check that runs on every request body before decoding must
not be the amplifier it guards against, and cutting strings out a chunk at a time must not lose a string that
spans two chunks."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from agent_runtime.serving import json_guard
from agent_runtime.serving.api_error import ApiError
from agent_runtime.serving.json_guard import MAX_JSON_DEPTH, MAX_NUMBER_DIGITS, check_json_body

MiB = 1 << 20


@pytest.mark.parametrize(
    ("name", "item"),
    [("empty strings", b'"",'), ("two-byte strings", b'"ab",'), ("escaped quotes", b'"\\"",'), ("numbers", b"1,")],
)
def test_an_8_mib_body_of_tiny_values_costs_at_most_two_and_a_half_times_its_size(name: str, item: bytes) -> None:
    body = b'{"model": "m", "messages": [' + item * ((8 * MiB - 64) // len(item)) + b'""]}'
    tracemalloc.start()
    try:
        check_json_body(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{name}: a {len(body) / MiB:.1f} MiB body, traced peak {peak / MiB:.1f} MiB ({peak / len(body):.2f}x)")
    # the body without its strings (chunks, then joined); splitting it whole at its quotes made 30x (220 MiB)
    assert peak < 2.5 * len(body)


def test_strings_that_span_a_chunk_hide_their_brackets_and_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_guard, "_SPLIT_CHUNK", 7)  # every string crosses chunk boundaries
    rng = random.Random(0)
    for _ in range(200):
        hidden = "".join(rng.choice(["[", "{", '"', "\\", "1" * 300, "x"]) for _ in range(rng.randint(0, 40)))
        body = json.dumps({"messages": [{"role": "user", "content": hidden}], "n": [1, [2]]}).encode()
        check_json_body(body)  # nothing inside a string counts
    deep = (
        json.dumps({"a": "][" * 50}).encode()[:-1]
        + b", "
        + b"[" * (MAX_JSON_DEPTH + 1)
        + b"]" * (MAX_JSON_DEPTH + 1)
        + b"}"
    )
    with pytest.raises(ApiError, match="nested more than"):
        check_json_body(deep)
    long = json.dumps({"a": '"quoted"'}).encode()[:-1] + b', "b": ' + b"9" * (MAX_NUMBER_DIGITS + 1) + b"}"
    with pytest.raises(ApiError, match="digits"):
        check_json_body(long)
