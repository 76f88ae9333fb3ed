"""How much the runtime costs per step, with no model time: 1,000 concurrent episodes on a replay engine, this tree
side by side with a baseline commit, interleaved in one run.

Each episode asks a calculator question; the engine answers with real Qwen3 token ids (three tool calls, then a
final answer), so every step does the full work of a live one: append the generated ids, read them (decode or the
engine's text) and parse them, run the calculator tool through the environment, score the step, render the
feedback and tokenize it alone. Per step = the run's wall time (prompts rendered and tokenized included) over its
steps.

The floor is tokenizing the same feedback deltas alone, as many times as the run does: the least any
token-in-token-out loop must do per step. It is measured in the same process right before and right after the run
(the mean of the two), so the ratio step / floor of one run compares two timings taken under the same load.

Each repeat runs both sides, each in a fresh process with its own sources first on `sys.path` (the baseline from a
temporary git worktree), alternating which side goes first; reported per side: the min and median over the
repeats of the time per step, the floor and their ratio.

What changed in how it measures (before: one in-process run of `ScriptedEngine`, the floor taken once after it):
the engine is `ReplayEngine` below, which answers in O(1) from the end of the prompt and returns a prepared
`Generation` (`ScriptedEngine` copied every prompt, counted tool responses over the whole prompt and decoded
every reply: O(history) per step, and memory that grew); the floor is taken around each run; the baseline runs in
the same session, interleaved, and each side runs `--repeats` times. The prepared generation says its text is
exactly the decode of its ids where the tree's `Generation` has that field (`exact_text`); a tree without it
decodes, which is the difference being measured.

The seed side (`--seed-repo PATH`, a checkout of github.com/Freder-chen/OpenRLHF-Agent; measured at f8937c9): the
same episodes through the seed design's own loop, imported from that checkout at run time (see `measure_seed`),
interleaved with the others. Every side also says whether its first episode's token stream is the official Qwen3
template's render of the same conversation (`template_exact`); "step vs this tree" is the ratio of medians.

What changed since (2026-12-03 evening): the floor calls the tokenizers backend itself (`list(backend.encode(text).
ids)`), where it called `HFTokenizer.encode`; that was the same call for a text this short until `HFTokenizer`
learned to cut a short text at its added tokens and take the pieces it has seen from its cache (a feedback's fixed
pieces, and here its results too, which repeat), so the floor is still the cost of tokenizing the feedback, not of
this repository's cache. `--new-results` (off by default) gives every episode its own numbers (its calls compute
`k * 17 + 4 + 100 i`), so no result repeats, the replay engine knows a prompt by its last 24 ids, and the floor
tokenizes every episode's own feedback once: the workload where the piece cache saves least.

    uv run python bench/bench_runtime.py [--episodes 1000] [--calls 3] [--repeats 3] [--baseline ee63069]
                                         [--seed-repo PATH | --new-results]
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent-protocol", "agent-env", "agent-runtime")
DEFAULT_BASELINE = "ee63069"  # main before issue 17


def replies(calls: int, offset: int = 4, tokenizer: Any = None) -> tuple[Any, Any, list[Any], Any]:
    """The tokenizer, the Qwen3 protocol, the generations of the tool-calling turns and of the answer: real Qwen3
    ids of the official template's assistant turns, with their text (both sides replay these). `offset`: the
    constant of the calls' expressions (`assistant_turns`); `tokenizer`: one already loaded."""
    from agent_protocol import HFTokenizer, get_protocol
    from agent_runtime import Generation
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    tokenizer = tokenizer or HFTokenizer.from_file(qwen3_tokenizer_path())
    protocol = get_protocol("qwen3")
    exact = {"exact_text": True} if "exact_text" in Generation.__struct_fields__ else {}

    def reply(message: dict[str, Any]) -> Any:
        ids = tokenizer.encode(protocol.render_generation(message))
        return Generation(ids=ids, text=tokenizer.decode(ids), logprobs=None, finish_reason="stop", **exact)

    *calling, last = assistant_turns(calls, offset)
    return tokenizer, protocol, [reply(message) for message in calling], reply(last)


def assistant_turns(calls: int, offset: int = 4) -> list[dict[str, Any]]:
    """What the model says in an episode: `calls` turns that call the calculator (`k * 17 + offset`), then the
    answer."""
    return [
        *({
            "role": "assistant", "content": "", "reasoning_content": f"Step {k}: compute with the tool.",
            "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": f"{k} * 17 + {offset}"}}}],
        } for k in range(calls)),
        {"role": "assistant", "content": "The answer is 55.", "reasoning_content": "Done."},
    ]  # fmt: skip


def tool_results(calls: int, offset: int = 4) -> list[str]:
    """What the calculator answers to the script's calls, in order."""
    return [str(k * 17 + offset) for k in range(calls)]


def episode_offset(episode: int) -> int:
    """`--new-results`: episode i's calls compute `k * 17 + 4 + 100 i`, so no result (k < 5) is seen twice."""
    return 4 + 100 * episode


def replay_table(encoded_feedback: list[list[int]], calls_made: list[Any], answer: Any) -> list[tuple[list[int], Any]]:
    """(the ids a prompt ends with, the reply that comes next): the prompt of turn k+1 ends with turn k's feedback."""
    return [(ids, calls_made[k + 1] if k + 1 < len(calls_made) else answer) for k, ids in enumerate(encoded_feedback)]


def template_exact(
    ids: Sequence[int], prompt: list[dict[str, Any]], calls: int, backend: Any, offset: int = 4
) -> float:
    """1.0 when an episode's token stream is the official Qwen3 template's render of its conversation (`prompt`,
    the script's turns and the calculator's results; the stream stops at the answer's `<|im_end|>`, before the
    newline the template writes after it), tokenized whole; else 0.0."""
    from agent_env import CalculatorTool
    from tests.support.hf_jinja import render_official

    turns = assistant_turns(calls, offset)
    messages = list(prompt)
    for turn, result in zip(turns[:-1], tool_results(calls, offset), strict=True):
        messages += [turn, {"role": "tool", "content": result}]
    messages.append(turns[-1])
    text = render_official("qwen3", messages, tools=[CalculatorTool().spec.to_openai()])
    official = list(backend.encode(text, add_special_tokens=False).ids)
    return float(official[: len(ids)] == list(ids) and backend.decode(official[len(ids) :]) == "\n")


TAIL = 24  # `--new-results`: the replay engine knows a prompt by this many of its last ids


def build(calls: int, new_results: int = 0) -> tuple[Any, Any, list[str]]:
    """The runtime (replay engine, calculator session), the tokenizer and the feedback texts the run tokenizes:
    one episode's, or with `new_results` (the episode count) every episode's own (`episode_offset`)."""
    import logging

    import structlog

    from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
    from agent_runtime import AgentRuntime, AgentSession, LLMEngine, SamplingParams

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))  # logs off the hot path
    tokenizer, protocol, calls_made, answer = replies(calls)
    feedback = [protocol.render_feedback([{"role": "tool", "content": result}]) for result in tool_results(calls)]
    after = replay_table([tokenizer.encode(text) for text in feedback], calls_made, answer)
    calculator = CalculatorTool()  # tools are read-only and shared; each episode gets its own environment
    by_tail: dict[tuple[int, ...], Any] = {}
    if new_results:
        feedback = []
        for episode, prompt in enumerate(episode_prompts(new_results)):
            _, _, calling, _ = replies(calls, episode_offset(episode), tokenizer)
            texts = [protocol.render_feedback([{"role": "tool", "content": r}])
                     for r in tool_results(calls, episode_offset(episode))]  # fmt: skip
            feedback += texts
            opening = protocol.render_prompt([{"role": "user", "content": prompt}], tools=[calculator.spec])
            stream = tokenizer.backend.encode(opening, add_special_tokens=False).ids
            by_tail[tuple(stream[-TAIL:])] = calling[0]
            for k, text in enumerate(texts):
                stream = [*calling[k].ids, *tokenizer.backend.encode(text, add_special_tokens=False).ids]
                by_tail[tuple(stream[-TAIL:])] = calling[k + 1] if k + 1 < calls else answer

    class ReplayEngine(LLMEngine):
        """Answers from the last few ids of the prompt and returns a prepared generation: copies nothing."""

        name = "replay"

        def __init__(self) -> None:
            self.tokenizer = tokenizer
            self.context_length = 32768
            self.stop_token_ids = (151645,)  # <|im_end|>

        async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Any = ()) -> Any:
            size = len(prompt_ids)
            if by_tail:
                return by_tail[tuple(prompt_ids[size - TAIL :])]
            for tail, generation in after:
                if prompt_ids[size - len(tail) :] == tail:
                    return generation
            return calls_made[0]

    session = AgentSession(
        protocol=protocol,
        environment=lambda: FunctionCallEnvironment(tools=[calculator], max_steps=calls + 2),
        rewards=RewardPipeline(result=[MatchingReward()]),
    )
    return AgentRuntime(ReplayEngine(), session), tokenizer, feedback


def floor_s(tokenizer: Any, feedback: list[str], repeats: int) -> float:
    """Tokenizing `feedback` `repeats` times (one episode's, once per episode; every episode's, once) alone:
    `list(backend.encode(text).ids)`, what `HFTokenizer.encode` did for a text this short before it learned to
    take cached pieces (the floor is what a loop must do, not what this repository's cache saves)."""
    backend = tokenizer.backend
    t0 = time.perf_counter()
    for _ in range(repeats):
        for text in feedback:
            list(backend.encode(text, add_special_tokens=False).ids)
    return time.perf_counter() - t0


def measure(episodes: int, calls: int, new_results: bool = False) -> dict[str, float]:
    """One run of this process's sources: time per step, and the floor taken around it."""
    runtime, tokenizer, feedback = build(calls, episodes if new_results else 0)
    prompts = episode_prompts(episodes)
    results, wall, floor = timed(
        lambda: asyncio.run(runtime.run_many(prompts[:20])),  # warm up
        lambda: asyncio.run(runtime.run_many(prompts, tasks=[{"answer": "55"}] * episodes)),
        tokenizer, feedback, 1 if new_results else episodes,
    )  # fmt: skip
    if not all(r.stop_reason == "final_answer" for r in results):
        raise RuntimeError("every episode must finish normally")
    exact = template_exact(results[0].trajectory.segments[0].ids, [{"role": "user", "content": prompts[0]}], calls,
                           tokenizer.backend, episode_offset(0) if new_results else 4)  # fmt: skip
    return figures(wall, sum(r.trajectory.turns for r in results), floor, exact)


def episode_prompts(episodes: int) -> list[str]:
    return [f"What is {i} * 17 + 4, three times over?" for i in range(episodes)]


def timed[R](
    warm_up: Callable[[], object], run: Callable[[], R], tokenizer: Any, feedback: list[str], repeats: int
) -> tuple[R, float, float]:
    """`run()`'s result, its wall time, and the floor per feedback: the mean of one taken right before and one right
    after it, in this process (after `warm_up()`)."""
    warm_up()
    floor_before = floor_s(tokenizer, feedback, repeats)
    t0 = time.perf_counter()
    results = run()
    wall = time.perf_counter() - t0
    floor_after = floor_s(tokenizer, feedback, repeats)
    return results, wall, (floor_before + floor_after) / 2 / (repeats * len(feedback))


def figures(wall: float, steps: int, floor: float, exact: float) -> dict[str, float]:
    return {
        "us_per_step": wall / steps * 1e6, "floor_us": floor * 1e6, "ratio": wall / steps / floor, "steps": steps,
        "template_exact": exact,
    }  # fmt: skip


def measure_seed(episodes: int, calls: int) -> dict[str, float]:
    """The same work through the seed design's loop (`--seed-repo`), as OpenRLHF's agent executor drives its
    `AgentInstance` in a rollout: `session.initialize` renders the prompt (Jinja), the prompt is tokenized whole;
    each turn the engine's ids are appended and its text parsed (`step_from_text` with the label: tool calls,
    then the reward), and the rendered feedback (Jinja) is tokenized alone and appended. The engine replays the
    same Qwen3 ids and texts as `ReplayEngine`, keyed on the seed's own feedback; the tool is this tree's exact
    calculator behind the seed's `ToolBase`; the environment is the seed's `FunctionCallEnvironment` with that one
    tool and an empty system prompt (this tree's side has none). The tokenizer is the same `tokenizers` backend,
    without the piece cache (the seed encodes every text whole). The floor is the seed's feedback deltas."""
    from openrlhf_agent import make_chat_protocol
    from openrlhf_agent.environment.function_call import FunctionCallEnvironment as SeedEnvironment
    from openrlhf_agent.environment.tools import ToolRegistry
    from openrlhf_agent.environment.tools.base import ToolBase as SeedTool
    from openrlhf_agent.orchestrator.session import AgentSession as SeedSession

    from agent_env import CalculatorTool
    from agent_env.tools.calculator import evaluate, format_number
    from agent_protocol import HFTokenizer

    shared, _, calls_made, answer = replies(calls)
    tokenizer = HFTokenizer(shared.backend, piece_cache=False)
    protocol = make_chat_protocol("qwen3_instruct")
    ours = CalculatorTool()

    class Calculator(SeedTool):  # type: ignore[misc]
        name = ours.name
        description = ours.description
        parameters = ours.parameters

        def call(self, *, context: Any, arguments: dict[str, Any]) -> str:
            return format_number(evaluate(str(arguments["expression"])))

    class Environment(SeedEnvironment):  # type: ignore[misc]
        @property
        def system_prompt(self) -> str:
            return ""

    feedback = [
        protocol.render_messages(messages=[{"role": "tool", "content": result}], add_generation_prompt=True)
        for result in tool_results(calls)
    ]
    after = replay_table([tokenizer.encode(text) for text in feedback], calls_made, answer)

    async def generate(prompt_ids: list[int]) -> tuple[list[int], str]:
        size = len(prompt_ids)
        for tail, generation in after:
            if prompt_ids[size - len(tail) :] == tail:
                return generation.ids, generation.text
        return calls_made[0].ids, calls_made[0].text

    streams: dict[str, list[int]] = {}

    async def episode(prompt: str, label: str) -> tuple[int, bool]:
        environment = Environment(max_steps=calls + 2)
        environment.registry = ToolRegistry([Calculator()])
        session = SeedSession(environment, protocol)
        ids = streams[prompt] = tokenizer.encode(session.initialize([{"role": "user", "content": prompt}]))
        turns = 0
        for _ in range(environment.max_steps):
            action_ids, action_text = await generate(ids)
            ids.extend(action_ids)
            outcome = session.step_from_text(action_text, label=label)
            turns += 1
            if outcome.terminated:
                return turns, "The answer is 55." in (outcome.feedback_messages[0].content or "")
            ids.extend(tokenizer.encode(outcome.feedback_text))
        return turns, False

    async def run_all(prompts: list[str]) -> list[tuple[int, bool]]:
        return list(await asyncio.gather(*(episode(prompt, "55") for prompt in prompts)))

    prompts = episode_prompts(episodes)
    results, wall, floor = timed(
        lambda: asyncio.run(run_all(prompts[:20])), lambda: asyncio.run(run_all(prompts)), tokenizer, feedback, episodes
    )
    if not all(turns == calls + 1 and answered for turns, answered in results):
        raise RuntimeError("every seed episode must make its calls and end on the answer")
    prompt = [{"role": "system", "content": ""}, {"role": "user", "content": prompts[0]}]  # the seed's conversation
    exact = template_exact(streams[prompts[0]], prompt, calls, tokenizer.backend)
    return figures(wall, sum(turns for turns, _ in results), floor, exact)


def run_side(
    paths: list[str], cwd: Path, flag: str, episodes: int, calls: int, new_results: bool = False
) -> dict[str, float]:
    """One run in a fresh process with `paths` first on `sys.path`; `flag`: --measure-only or --measure-seed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    argv = [sys.executable, __file__, flag, "--episodes", str(episodes), "--calls", str(calls)]
    argv += ["--new-results"] if new_results else []
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{flag} in {cwd} failed:\n{done.stderr.strip()}")
    out = done.stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("us_per_step", "floor_us", "ratio"):
        values = [r[key] for r in runs]
        out[f"{key}_min"] = round(min(values), 2)
        out[f"{key}_median"] = round(statistics.median(values), 2)
    return out


def exactness(runs: list[dict[str, float]]) -> str:
    """Whether the side's token stream was the official template's in every run ("n/a": it does not say)."""
    found = {r["template_exact"] for r in runs if "template_exact" in r}
    if not found:
        return "n/a"
    return "yes" if found == {1.0} else "no" if found == {0.0} else "not always"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000, help="concurrent episodes (default 1000)")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per episode before the answer (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help=f"git ref to compare with ({DEFAULT_BASELINE})")
    parser.add_argument("--no-baseline", action="store_true", help="measure this tree only")
    parser.add_argument(
        "--seed-repo", type=Path,
        help="a checkout of the seed design (github.com/Freder-chen/OpenRLHF-Agent, measured at f8937c9): adds its "
        "loop as a side, on the same work (see measure_seed); it needs jinja2 and pydantic, which this workspace has",
    )  # fmt: skip
    parser.add_argument(
        "--new-results", action="store_true",
        help="every episode's calls compute their own numbers (k * 17 + 4 + 100 i), so no tool result is seen twice "
        "and the floor tokenizes every episode's own feedback (default: every episode gets the same three results)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure-seed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_only or args.measure_seed:
        sys.path.insert(0, os.getcwd())
        if args.measure_seed:
            print(json.dumps(measure_seed(args.episodes, args.calls)))
        else:
            print(json.dumps(measure(args.episodes, args.calls, args.new_results)))
        return
    this_tree = [str(ROOT / "packages" / p / "src") for p in PACKAGES] + [str(ROOT)]
    sides = {"this tree": (this_tree, ROOT, "--measure-only")}
    if args.seed_repo is not None and args.new_results:
        parser.error("--new-results runs this tree and the baseline only (the seed side replays one episode's results)")
    if args.seed_repo is not None:
        seed_src = args.seed_repo.resolve() / "src"
        if not (seed_src / "openrlhf_agent" / "orchestrator" / "session.py").is_file():
            parser.error(f"--seed-repo {args.seed_repo}: no src/openrlhf_agent/orchestrator/session.py there")
        sides["seed loop"] = ([str(seed_src), *this_tree], ROOT, "--measure-seed")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        if not args.no_baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), args.baseline],
                           check=True)  # fmt: skip
            sides[f"baseline {args.baseline}"] = ([str(tree / "packages" / p / "src") for p in PACKAGES] + [str(tree)],
                                                  tree, "--measure-only")  # fmt: skip
        try:
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
            for repeat in range(args.repeats):
                order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
                for name in order:
                    runs[name].append(run_side(*sides[name], args.episodes, args.calls, args.new_results))
        finally:
            if not args.no_baseline:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    summaries = {name: summary(values) for name, values in runs.items()}
    results = "every result new" if args.new_results else "the same results in every episode"
    print(f"{args.episodes} concurrent episodes x {args.calls} tool calls ({results}); {args.repeats} interleaved "
          "repeats")  # fmt: skip
    print("| code | us per step (min / median) | floor us (min / median) | step / floor (min / median) "
          "| step vs this tree (median) | tokens = template's |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|")
    ours = summaries["this tree"]["us_per_step_median"]
    for name, s in summaries.items():
        cells = [f"{s[f'{key}_min']:.{digits}f} / {s[f'{key}_median']:.{digits}f}"
                 for key, digits in (("us_per_step", 0), ("floor_us", 1), ("ratio", 1))]  # fmt: skip
        cells.append(f"{s['us_per_step_median'] / ours:.2f}x")
        cells.append(exactness(runs[name]))
        print(f"| {name} | {' | '.join(cells)} |")
    if args.json:
        result = {name: {**summaries[name], "runs": values} for name, values in runs.items()}
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
