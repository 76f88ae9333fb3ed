"""Does a turn cost the same at 1k, 8k and 32k tokens of history? Agent-mode steps and tools-mode follow-up
requests, this tree side by side with a baseline commit, in one run.

- Agent mode: an `AgentSession` (qwen3 protocol, the real Qwen3 tokenizer rebuilt offline, the calculator tool)
  whose history is a user message of N tokens. One step = `next_request` + `step(generation)`: the generated
  tool call's ids are appended as they are, the call is parsed and run, the feedback is rendered and tokenized
  alone. Reported: the median over `--steps` steps.
- Tools mode: the server's request path without the socket (`decode_request`, `coerce_messages`,
  `complete_tools` on a `ServingBackend`), on a conversation of N tokens that a first request stored; each
  follow-up sends the whole conversation back with one more tool result, as a client does. Reported: the median
  over `--steps` follow-ups. Part of this cost is O(history) by nature (the client sends the whole conversation:
  parsing it and hashing it for the store key); what the server adds on top is what changed.

The engine replays one fixed tool call and copies nothing (`ReplayEngine`), so the time is the runtime's own.
The baseline (`--baseline REF`, default the parent of the commit that introduced the turn core) is checked out
in a temporary git worktree and measured by this same script in a subprocess, with its own sources first on
`sys.path`.

    uv run python bench/bench_turn_cost.py [--baseline a268aa3] [--sizes 1000 8000 32000] [--steps 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent-protocol", "agent-env", "agent-runtime")
DEFAULT_BASELINE = "a268aa3"  # main before the turn core
WORDS = [
    "the",
    "model",
    "reads",
    "a",
    "passage",
    "about",
    "tokenizers",
    "rollouts",
    "rewards",
    "transcripts",
    "templates",
    "engines",
    "policy",
    "value",
    "advantage",
    "baseline",
    "context",
    "budget",
    "summary",
    "tool",
    "call",
    "result",
    "page",
    "index",
    "gradient",
    "batch",
    "sample",
]
CALL_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34 + 5"}}\n</tool_call><|im_end|>'


def filler(tokens: int) -> str:
    """About `tokens` Qwen3 tokens of plain words."""
    return " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(tokens))


async def agent_mode(size: int, steps: int) -> float:
    from agent_env import CalculatorTool, FunctionCallEnvironment
    from agent_protocol import load_tokenizer
    from agent_runtime import AgentSession, Generation
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    tokenizer = load_tokenizer(qwen3_tokenizer_path())
    call = tokenizer.encode(CALL_TEXT)
    session = AgentSession(
        "qwen3",
        FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=steps + 10),
        tokenizer=tokenizer,
        max_new_tokens=64,
        max_context_tokens=None,
    )
    await session.reset(filler(size))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        request = await session.next_request()
        assert request is not None
        await session.step(Generation(ids=list(call), text=CALL_TEXT, logprobs=None, finish_reason="stop"))
        times.append(time.perf_counter() - t0)
    assert not session.done, session.stop_reason
    return statistics.median(times)


async def tools_mode(size: int, steps: int) -> float:
    from agent_env import CalculatorTool, FunctionCallEnvironment
    from agent_protocol import coerce_messages, coerce_tools, load_tokenizer
    from agent_runtime import Generation, LLMEngine, SamplingParams
    from agent_runtime.recipe import Recipe
    from agent_runtime.serving import ServeConfig
    from agent_runtime.serving.backend import ServingBackend
    from agent_runtime.serving.openai_wire import decode_request
    from agent_runtime.serving.tools_mode import complete_tools
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    tokenizer = load_tokenizer(qwen3_tokenizer_path())
    call = tokenizer.encode(CALL_TEXT)

    class ReplayEngine(LLMEngine):
        name = "replay"

        def __init__(self) -> None:
            self.tokenizer = tokenizer
            self.context_length = 1_000_000
            self.stop_token_ids = ()

        async def generate(
            self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
        ) -> Generation:
            return Generation(ids=list(call), text=CALL_TEXT, logprobs=None, finish_reason="stop")

    tool = CalculatorTool()
    recipe = Recipe(
        name="bench", protocol="qwen3", environment=lambda: FunctionCallEnvironment(tools=[tool]), max_new_tokens=64
    )
    backend = ServingBackend(ReplayEngine(), recipe, ServeConfig(model_name="bench"))
    spec = {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "user", "content": filler(size)}]
    times = []
    for index in range(steps + 1):
        t0 = time.perf_counter()
        body = json.dumps({"model": "bench", "messages": messages, "tools": [spec]}).encode()
        chat = decode_request(body)
        result = await complete_tools(backend, chat, coerce_messages(chat.messages), coerce_tools(chat.tools))
        if index:  # the first request renders the conversation; the follow-ups are what is measured
            times.append(time.perf_counter() - t0)
        message = result.choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                               "arguments": c.function.arguments}}
                 for c in message.tool_calls or []]  # fmt: skip
        messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
        messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "413"})
    hits = backend.metrics.transcript_prefix_hits
    assert hits == steps, f"only {hits} of {steps} follow-ups continued the stored transcript"
    return statistics.median(times)


def measure(sizes: Sequence[int], steps: int) -> dict[str, dict[str, float]]:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return {
        str(size): {
            "agent_step_ms": asyncio.run(agent_mode(size, steps)) * 1e3,
            "tools_request_ms": asyncio.run(tools_mode(size, steps)) * 1e3,
        }
        for size in sizes
    }


def measure_baseline(ref: str, sizes: Sequence[int], steps: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), ref], check=True)
        try:
            paths = [str(tree / "packages" / p / "src") for p in PACKAGES] + [str(tree)]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
            argv = [sys.executable, __file__, "--measure-only", "--steps", str(steps), "--sizes", *map(str, sizes)]
            out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    result: dict[str, dict[str, float]] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 8000, 32000], help="history sizes in tokens")
    parser.add_argument("--steps", type=int, default=30, help="steps / follow-ups measured per size (default 30)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"git ref to compare with ({DEFAULT_BASELINE})")
    parser.add_argument("--no-baseline", action="store_true", help="measure this tree only")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_only:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(measure(args.sizes, args.steps)))
        return
    sys.path.insert(0, str(ROOT))
    current = measure(args.sizes, args.steps)
    baseline = None if args.no_baseline else measure_baseline(args.baseline, args.sizes, args.steps)
    first = str(args.sizes[0])
    for size in map(str, args.sizes):
        row: dict[str, Any] = {"history_tokens": int(size)}
        for key in ("agent_step_ms", "tools_request_ms"):
            row[key] = round(current[size][key], 3)
            row[f"{key}_vs_{first}"] = round(current[size][key] / current[first][key], 2)
            if baseline is not None:
                row[f"baseline_{key}"] = round(baseline[size][key], 3)
                row[f"baseline_{key}_vs_{first}"] = round(baseline[size][key] / baseline[first][key], 2)
                row[f"{key}_baseline_over_now"] = round(baseline[size][key] / current[size][key], 2)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
