"""Cost of preparing the next prompt in a long tool-use episode, three ways, side by side in one run, per family.

A 64-turn episode (two tools, reasoning on most turns) that grows to about 32k tokens, rendered by each model
family's protocol and tokenized by that family's real tokenizer (Qwen3: rebuilt offline, tests/support/
qwen3_tokenizer.py; gpt-oss, Llama 3, DeepSeek-V3: the official files in tests/data/tokenizers). GLM-4.5 and
Mistral have no tokenizer here: their rows use the Qwen3 tokenizer with the family's control tokens added as
special tokens, a stand-in (timings comparable, ids not theirs; marked). Before each generation:

  (a) TokenTranscript: append the generated ids as they are, tokenize only the feedback delta;
  (b) what many frameworks do: re-render the whole conversation with the official Jinja template (Hugging Face
      conventions) and re-tokenize all of it;
  (c) the floor: encode the delta text alone with `tokenizers`, nothing else.

Reports per-turn and total times, the ratios a/c and b/a, and on how many turns (b)'s ids differ from (a)'s
(where the template is not append-only, re-rendering changes tokens the policy already sampled).

    uv run python bench/bench_transcript.py [--protocol qwen3 --protocol gpt-oss ...] [--turns 64] [--repeats 5]
        [--json out.json]          # default: every family
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_protocol import ChatProtocol, HFTokenizer, MessageError, TokenTranscript, get_protocol, protocol_options  # noqa: E402
from agent_protocol.chatml import ChatMLProtocol  # noqa: E402
from agent_protocol.families import family_table  # noqa: E402
from examples.family_smoke import family_tokenizer as stand_in_tokenizer  # noqa: E402
from tests.support.family_tokenizers import load_family_tokenizer  # noqa: E402
from tests.support.hf_jinja import render_official, special_tokens  # noqa: E402
from tests.support.qwen3_tokenizer import qwen3_tokenizer_path  # noqa: E402

FROZEN_TODAY = date(2025, 9, 1)  # what tests/support/hf_jinja.py freezes strftime_now to


@dataclass(frozen=True)
class Family:
    """One row of the bench: the protocol, its official template, its tokenizer and the template's quirks."""

    protocol: str
    template: str
    tokenizer: str  # "qwen3" or a key of tests/support/family_tokenizers.SHA256
    options: dict[str, Any] = field(default_factory=dict)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    stand_in: bool = False  # the tokenizer is not the family's own (none is available here)


TEMPLATES = ROOT / "tests" / "data" / "golden" / "templates"
#: the families whose own tokenizer is in tests/data/tokenizers (a key of family_tokenizers.SHA256); the other
#: ChatML families use Qwen3's, and every other family a stand-in
REAL_TOKENIZERS = {
    "gpt-oss": "gpt_oss",
    "llama3.1": "llama3.1",
    "llama3.2": "llama3.1",
    "deepseek-v3.1": "deepseek_v3",
    "mistral-v0.3": "mistral_v3",
    "llama4": "llama4",
    "deepseek-v3.1-vllm-tools": "deepseek_v3",
    "nemotron-super-v1.5": "llama3.1",  # Llama 3.3 based: Llama 3's vocabulary and header tokens
    "gemma3-vllm-pythonic": "gemma3",
}


def bench_family(name: str, template: str) -> Family | None:
    """The bench's row for a member of the family table with a golden template (None: one that renders no tools,
    which the episode needs, or one with no text renders in tests/data/golden/rendered, whose special tokens the
    official render needs: qwen3-vl; a vision family with text renders, Qwen3.5, is measured on the episode's
    text). A template that prints today's date gets the date the renders freeze."""
    protocol = get_protocol(name)
    try:
        special_tokens(template)
    except KeyError:
        return None
    try:
        with warnings.catch_warnings():  # a probe: deepseek-v3.1 warns that its template shows no tools
            warnings.simplefilter("ignore")
            protocol.render_messages([{"role": "user", "content": "x"}], tools=[TOOLS[0]])
        call = {"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": {}}}
        protocol.render_generation({"role": "assistant", "content": "", "tool_calls": [call]})  # gemma3: no calls
    except MessageError:
        return None
    # Llama 4's template calls strftime_now and never prints the date: the protocol then takes no `today`
    dated = "strftime_now" in (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
    dated = dated and "today" in protocol_options(name)
    stand_in = name not in REAL_TOKENIZERS and not isinstance(protocol, ChatMLProtocol)
    options: dict[str, Any] = {"today": FROZEN_TODAY} if dated else {}
    return Family(name, template, REAL_TOKENIZERS.get(name, "qwen3"), options, stand_in=stand_in)


def for_template(family: Family, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the official template wants them (the protocols take OpenAI messages as they are):
    gpt-oss reads reasoning from `thinking`; DeepSeek-V3.1 concatenates arguments, so they must be a string."""
    out = []
    for message in messages:
        message = dict(message)
        if family.protocol == "gpt-oss" and "reasoning_content" in message:
            message["thinking"] = message.pop("reasoning_content")
        if family.protocol == "deepseek-v3.1" and message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def family_tokenizer(family: Family, protocol: ChatProtocol) -> HFTokenizer:
    """The family's own tokenizer; for a stand-in, Qwen3's with the family's control tokens added as special
    tokens (each one id, as in the family's real vocabulary), so that piecewise and whole encodings cut alike."""
    if family.stand_in:
        tokenizer, _ = stand_in_tokenizer(protocol)
        assert isinstance(tokenizer, HFTokenizer)
        return tokenizer
    if family.tokenizer == "qwen3":
        return HFTokenizer.from_file(qwen3_tokenizer_path())
    return load_family_tokenizer(family.tokenizer)


def ended_by(protocol: ChatProtocol, generated: str) -> str | None:
    """Which of the protocol's turn-end tokens a generated turn ends with (what the turn core hands on)."""
    return next((t for t in protocol.turn_end_texts if t and generated.endswith(t)), None)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the document store.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "open_page",
            "description": "Open a page by id.",
            "parameters": {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        },
    },
]

#: every member of the family table (agent_protocol.families) with a golden template that renders tools
FAMILIES = {
    member.name: family
    for entry in family_table()
    for member in entry.members
    if member.template and (family := bench_family(member.name, member.template)) is not None
}

_VOCABULARY = (
    "the model reads a passage about tokenizers rollouts rewards transcripts templates engines vllm ray "
    "deepspeed gradient policy value advantage baseline context budget summary tool call result page index"
)
WORDS = _VOCABULARY.split()


def make_episode(turns: int, seed: int = 0) -> list[dict[str, Any]]:
    """System, one user task, then `turns` assistant turns each calling a tool, each answered by a ~390-token
    tool result. Every fifth turn has no reasoning (the model went straight to the call)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a research agent. Use the tools."},
        {"role": "user", "content": "Collect everything the store says about token-in-token-out training."},
    ]
    for turn in range(turns):
        reasoning = "" if turn % 5 == 4 else " ".join(rng.choices(WORDS, k=25))
        name, arguments = ("search", {"query": " ".join(rng.choices(WORDS, k=4))})
        if turn % 2:
            name, arguments = "open_page", {"page": rng.randint(1, 999)}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": reasoning,
                "tool_calls": [{"id": f"call{turn:05d}", "function": {"name": name, "arguments": arguments}}],
            }
        )  # 9-character ids: Mistral's templates refuse others
        result = " ".join(rng.choices(WORDS, k=375))
        messages.append({"role": "tool", "tool_call_id": f"call{turn:05d}", "name": name, "content": result})
    return messages


def run(family: Family, turns: int, repeats: int) -> dict[str, Any]:
    protocol = get_protocol(family.protocol, **family.options)
    tokenizer = family_tokenizer(family, protocol)
    backend = tokenizer.backend
    messages = make_episode(turns)
    official = for_template(family, messages)
    prefix = messages[:2]
    generated_texts = [protocol.render_generation(m) for m in messages[2::2]]
    generated = [tokenizer.encode(text) for text in generated_texts]
    feedback_texts = [
        protocol.render_feedback([m], ended_by=ended_by(protocol, text))
        for m, text in zip(messages[3::2], generated_texts, strict=True)
    ]

    a_times: list[list[float]] = [[] for _ in range(turns)]
    b_times: list[list[float]] = [[] for _ in range(turns)]
    c_times: list[list[float]] = [[] for _ in range(turns)]
    final_tokens = 0
    b_ids_per_turn: list[list[int]] = []
    a_ids_per_turn: list[list[int]] = []
    for repeat in range(repeats):
        # Each method runs over the whole episode on its own, so none pollutes another's caches. The tokenizer's
        # piece caches are emptied first: the tool results are new to it in every repeat, as in an episode (kept,
        # the second repeat would find each whole result cached, and (a) would time dictionary lookups)
        for cache in (tokenizer.pieces, tokenizer.short_pieces):
            if cache is not None:
                cache.clear()
        transcript = TokenTranscript()
        transcript.append_prompt(tokenizer.encode(protocol.render_prompt(prefix, tools=TOOLS)))
        for turn in range(turns):  # (a) append the sampled ids, tokenize only the delta
            t0 = time.perf_counter()
            transcript.append_action(generated[turn])
            transcript.append_observation(tokenizer.encode(feedback_texts[turn]))
            a_times[turn].append(time.perf_counter() - t0)
            if repeat == 0:
                a_ids_per_turn.append(list(transcript.ids))
        final_tokens = len(transcript)
        for turn in range(turns):  # (c) the floor: encode the delta text alone
            t0 = time.perf_counter()
            backend.encode(feedback_texts[turn], add_special_tokens=False)
            c_times[turn].append(time.perf_counter() - t0)
        for turn in range(turns):  # (b) re-render everything with the official Jinja and re-tokenize it
            history = official[: 2 + 2 * (turn + 1)]
            t0 = time.perf_counter()
            text = render_official(
                family.template, history, tools=TOOLS, add_generation_prompt=True, **family.template_kwargs
            )
            ids = backend.encode(text, add_special_tokens=False).ids
            b_times[turn].append(time.perf_counter() - t0)
            if repeat == 0:
                b_ids_per_turn.append(list(ids))
    differing_turns = sum(1 for a_ids, b_ids in zip(a_ids_per_turn, b_ids_per_turn, strict=True) if a_ids != b_ids)

    a = [min(t) for t in a_times]
    b = [min(t) for t in b_times]
    c = [min(t) for t in c_times]
    return {
        "protocol": family.protocol,
        "tokenizer": family.tokenizer + (" (stand-in)" if family.stand_in else ""),
        "turns": turns,
        "repeats": repeats,
        "final_tokens": final_tokens,
        "per_turn_ms": {"a": [x * 1e3 for x in a], "b": [x * 1e3 for x in b], "c": [x * 1e3 for x in c]},
        "total_ms": {"a": sum(a) * 1e3, "b": sum(b) * 1e3, "c": sum(c) * 1e3},
        "ratio_a_over_c": sum(a) / sum(c),
        "ratio_b_over_a": sum(b) / sum(a),
        "median_turn_ratio_b_over_a": statistics.median(x / y for x, y in zip(b, a, strict=True)),
        "turns_where_b_ids_differ": differing_turns,
        "render_python_vs_jinja_ms": render_speed(family, protocol, messages, official),
    }


def render_speed(
    family: Family,
    protocol: ChatProtocol,
    messages: list[dict[str, Any]],
    official: list[dict[str, Any]],
    repeats: int = 5,
) -> dict[str, float]:
    """Rendering the full conversation once: this project's Python renderer vs the official Jinja."""
    python_ms = min(_timed(lambda: protocol.render_messages(messages, tools=TOOLS)) for _ in range(repeats))
    jinja_ms = min(
        _timed(lambda: render_official(family.template, official, tools=TOOLS, **family.template_kwargs))
        for _ in range(repeats)
    )
    return {"python": python_ms, "jinja": jinja_ms, "jinja_over_python": jinja_ms / python_ms}


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def summary(results: list[dict[str, Any]]) -> str:
    """One row per family: totals, ratios, drifted turns."""
    lines = [
        "| protocol | tokenizer | tokens | (a) total | (b) total | (c) total | a/c | b/a | turns (b) drifts "
        "| Jinja/Python render |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = r["total_ms"]
        lines.append(
            f"| {r['protocol']} | {r['tokenizer']} | {r['final_tokens']} | {t['a']:.1f} ms | {t['b']:.0f} ms | "
            f"{t['c']:.1f} ms | {r['ratio_a_over_c']:.2f} | {r['ratio_b_over_a']:.0f} | "
            f"{r['turns_where_b_ids_differ']} of {r['turns']} "
            f"| {r['render_python_vs_jinja_ms']['jinja_over_python']:.1f} |"
        )
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    per_turn = result["per_turn_ms"]
    shown = sorted({1, 8, 16, 32, 48, result["turns"]} & set(range(1, result["turns"] + 1)))
    lines = [
        f"{result['protocol']}: {result['turns']} tool turns, {result['final_tokens']} tokens at the end; "
        f"best of {result['repeats']} runs per turn.",
        "",
        "| turn | (a) TokenTranscript, delta only | (b) Jinja re-render + re-tokenize | (c) delta encode floor |",
        "|---:|---:|---:|---:|",
    ]
    for turn in shown:
        i = turn - 1
        lines.append(f"| {turn} | {per_turn['a'][i]:.3f} ms | {per_turn['b'][i]:.3f} ms | {per_turn['c'][i]:.3f} ms |")
    total = result["total_ms"]
    lines += [
        f"| **total** | **{total['a']:.1f} ms** | **{total['b']:.1f} ms** | **{total['c']:.1f} ms** |",
        "",
        f"- a/c = {result['ratio_a_over_c']:.2f} (overhead of the transcript over bare delta encoding)",
        f"- b/a = {result['ratio_b_over_a']:.1f} over the episode "
        f"(median per turn {result['median_turn_ratio_b_over_a']:.1f})",
        f"- turns where (b)'s ids differ from (a)'s: {result['turns_where_b_ids_differ']} of {result['turns']}",
        f"- rendering the final conversation once: Python {result['render_python_vs_jinja_ms']['python']:.2f} ms, "
        f"official Jinja {result['render_python_vs_jinja_ms']['jinja']:.2f} ms "
        f"(Jinja/Python = {result['render_python_vs_jinja_ms']['jinja_over_python']:.1f})",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--protocol",
        action="append",
        choices=sorted(FAMILIES),
        help="a family to measure (repeatable; default: every family)",
    )
    parser.add_argument("--turns", type=int, default=64, help="tool turns in the episode (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per turn; the best is reported (default 5)")
    parser.add_argument("--detail", action="store_true", help="also print the per-turn table of each family")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    args = parser.parse_args()
    results = []
    for name in args.protocol or list(FAMILIES):
        results.append(run(FAMILIES[name], args.turns, args.repeats))
        if args.detail:
            print(markdown(results[-1]) + "\n")
    print(summary(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
