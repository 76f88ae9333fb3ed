"""What tokenizing one turn's feedback costs: `HFTokenizer.encode` (a short text cut at every added token, the
pieces it has seen taken from its piece cache) side by side with the tokenizer's own encode of the whole text (what
`HFTokenizer.encode` did for a text under 512 characters before), on the real Qwen3 tokenizer, interleaved.

Two workloads of Qwen3 feedback (a `<tool_response>` turn and the next generation prompt): results seen before (the
same few numbers again, as a calculator's small results repeat) and results never seen before (every text has its
own number, so its result is always a new piece and only the fixed pieces are cached). Each repeat times both sides
on the same texts, alternating which goes first; reported: min and median of the per-text time, and whole / cached
(above 1: the cache is faster). Every text's ids are checked equal on both sides first.

    uv run python bench/bench_feedback_encode.py [--texts 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def per_text_us(encode: Callable[[str], object], texts: list[str]) -> float:
    started = time.perf_counter()
    for text in texts:
        encode(text)
    return (time.perf_counter() - started) / len(texts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=5000, help="feedback texts per workload and repeat (5000)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from agent_protocol import HFTokenizer, get_protocol
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
    protocol = get_protocol("qwen3")

    def feedback(result: int) -> str:
        return protocol.render_feedback([{"role": "tool", "content": str(result)}])

    def whole(text: str) -> list[int]:
        return list(tokenizer.backend.encode(text, add_special_tokens=False).ids)

    print(f"{args.texts} Qwen3 feedback texts per workload, {args.repeats} interleaved repeats")
    print("| workload | whole encode us (min / median) | HFTokenizer.encode us (min / median) | whole / cached |")
    print("|---|---:|---:|---:|")
    for name, result_of in (
        ("results seen before", lambda i, r: i % 3 * 17 + 4),
        ("every result new", lambda i, r: 10_000_000 + r * args.texts + i),
    ):
        times: dict[str, list[float]] = {"whole": [], "cached": []}
        for repeat in range(args.repeats):
            texts = [feedback(result_of(i, repeat)) for i in range(args.texts)]
            assert all(tokenizer.encode(t) == whole(t) for t in texts[:200]), "the ids differ"
            sides = [("whole", whole), ("cached", tokenizer.encode)]
            for side, encode in sides if repeat % 2 == 0 else reversed(sides):
                texts = [feedback(result_of(i, repeat + 100 * (side == "cached"))) for i in range(args.texts)]
                times[side].append(per_text_us(encode, texts))
        w, c = times["whole"], times["cached"]
        print(f"| {name} | {min(w):.1f} / {statistics.median(w):.1f} | {min(c):.1f} / {statistics.median(c):.1f} "
              f"| {statistics.median(w) / statistics.median(c):.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
