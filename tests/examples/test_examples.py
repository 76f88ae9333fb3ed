"""Every example's smoke mode, run in CI: each recipe loads as the apps load it, and each scripted episode ends
the way the example says it does (right answers scored 1.0, the gold passages retrieved, compaction carrying an
episode through a context too small for it, the OpenRLHF record built from the last segment)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent_env import EpisodeRecord
from agent_protocol import MessageError, list_protocols
from agent_runtime import BudgetPolicy, CompactionPolicy, Recipe, load_recipe
from examples._smoke import Prompt, qwen3_tokenizer, reply, runtime_for, scripted_engine, tool_call
from examples.compact import smoke as compact_smoke_mode
from examples.qwen3 import smoke as qwen3_smoke_mode
from examples.search_r1 import build_data as search_data
from examples.search_r1 import smoke as search_smoke_mode
from examples.single_turn import build_data as math_data
from examples.single_turn import smoke as math_smoke_mode

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NAMES = ["qwen3", "search_r1", "single_turn", "compact"]


def score(recipe: Recipe, answer: str, references: list[str]) -> float:
    assert recipe.rewards is not None
    record = EpisodeRecord(final_answer=answer, references=tuple(references))
    return asyncio.run(recipe.rewards.score(record)).total


@pytest.fixture(scope="module", autouse=True)
def _tokenizer(qwen3_tokenizer_file: Path) -> None:
    """Build (or find) the offline Qwen3 tokenizer through the shared fixture before any smoke mode runs."""


# -- every example ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_recipe_loads_and_has_a_test_split(name: str) -> None:
    recipe = load_recipe(EXAMPLES / name / "recipe.py")
    assert isinstance(recipe, Recipe)
    session = recipe.make_session(qwen3_tokenizer())
    assert session.protocol.name == "qwen3"
    rows = list(recipe.rows("test"))
    assert len(rows) >= 20
    assert all(isinstance(row["prompt"], str) and row["prompt"] for row in rows)
    assert all(row.get("answer") or row.get("references") for row in rows)
    assert recipe.rewards is not None


@pytest.mark.parametrize("name", NAMES)
def test_readme_names_the_smoke_and_real_model_commands(name: str) -> None:
    readme = (EXAMPLES / name / "README.md").read_text(encoding="utf-8")
    assert f"uv run python -m examples.{name}.smoke" in readme
    assert f"uv run apps/train --backend openrlhf --recipe examples/{name}/recipe.py" in readme
    assert f"--recipe examples/{name}/recipe.py" in readme and "uv run apps/serve" in readme


def _quoted_flags(app: str) -> set[str]:
    """Every `--flag` the READMEs pass to `uv run apps/<app>` (continuation lines included, OpenRLHF's own
    arguments after a lone `--` left out)."""
    flags: set[str] = set()
    for readme in EXAMPLES.glob("*/README.md"):
        command: list[str] = []
        for line in readme.read_text(encoding="utf-8").splitlines():
            if f"uv run apps/{app} " in line or command:
                command.append(line.split(f"uv run apps/{app} ", 1)[-1])
                if line.rstrip().endswith("\\"):
                    continue
                words = " ".join(command).split(" -- ", 1)[0].split()
                flags.update(w.split("=", 1)[0] for w in words if w.startswith("--"))
                command = []
    return flags


@pytest.mark.parametrize("app", ["train", "serve"])
def test_readmes_quote_only_real_flags(app: str) -> None:
    flags = _quoted_flags(app)
    assert "--recipe" in flags
    done = subprocess.run([sys.executable, f"apps/{app}", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    unknown = sorted(flag for flag in flags if flag not in done.stdout)
    assert not unknown, f"README commands pass flags apps/{app} does not have: {unknown}"


def test_a_smoke_mode_runs_as_a_script() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "examples.qwen3.smoke"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mean reward 1.00" in done.stdout


# -- qwen3: multi-turn function calling -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_smoke() -> qwen3_smoke_mode.SmokeResult:
    return asyncio.run(qwen3_smoke_mode.run_smoke(count=8, out=False))


def test_qwen3_answers_every_question_with_both_tools(qwen3_smoke: qwen3_smoke_mode.SmokeResult) -> None:
    assert qwen3_smoke.answers == [f"Answer: {gold}" for gold in qwen3_smoke.expected]
    assert qwen3_smoke.rewards == [1.0] * 8
    assert qwen3_smoke.tool_sequences == [["calculator", "convert_units"]] * 8
    assert any("tool call  convert_units" in line for line in qwen3_smoke.streamed)
    assert qwen3_smoke.streamed[-1].startswith("[final]") and "reward=1.00" in qwen3_smoke.streamed[-1]


#: the recipe is a tool agent: every family whose official template renders tools (qwen2.5-vl's and gemma3's have no
#: tool format: qwen2.5-vl refuses tools, gemma3 renders them as its template does, dropped, with a warning, and
#: refuses to generate a call; the smoke probes each family and refuses these before any episode runs)
NO_TOOL_FAMILIES = {"qwen2.5-vl", "gemma3"}
TOOL_FAMILIES = [name for name in list_protocols() if name not in NO_TOOL_FAMILIES]


@pytest.mark.parametrize("protocol", sorted(NO_TOOL_FAMILIES))
def test_the_recipe_refuses_a_family_without_a_tool_format_saying_so(protocol: str) -> None:
    with pytest.raises(MessageError, match=f"{re.escape(protocol)} renders no tool format") as info:
        asyncio.run(qwen3_smoke_mode.run_smoke(count=1, out=False, protocol=protocol))
    assert info.value.location == "protocol"  # refused by the smoke's probe, before any episode


@pytest.mark.filterwarnings("ignore::agent_protocol.TemplateGapWarning")  # checked in the family tests
@pytest.mark.parametrize("protocol", TOOL_FAMILIES)
def test_the_qwen3_recipe_runs_in_every_family(protocol: str) -> None:
    # The same agent in each family's format, on its tokenizer: the policy reads prompts with a reader learned
    # from the family's renderer and answers with messages the family's protocol writes. An unreadable prompt,
    # a call the family cannot parse back or a turn that never closes costs the episode its reward.
    result = asyncio.run(qwen3_smoke_mode.run_smoke(count=3, out=False, protocol=protocol))
    assert result.answers == [f"Answer: {gold}" for gold in result.expected]
    assert result.tool_sequences == [["calculator", "convert_units"]] * 3


def test_qwen3_reward_is_an_exact_match() -> None:
    recipe = load_recipe(EXAMPLES / "qwen3" / "recipe.py")
    assert score(recipe, "Answer: 52.71", ["52.71"]) == 1.0
    assert score(recipe, "Answer: 52.7", ["52.71"]) == 0.0
    assert score(recipe, "about fifty", ["52.71"]) == 0.0


def test_qwen3_convert_units_refuses_a_pair_it_cannot_convert() -> None:
    recipe = load_recipe(EXAMPLES / "qwen3" / "recipe.py")

    def policy(prompt: Prompt) -> str:
        if not prompt.tool_results():
            return tool_call("convert_units", {"value": 3, "from_unit": "mi", "to_unit": "kg"}, "Convert.")
        return reply("Answer: none", "The tool refused.")

    result = asyncio.run(runtime_for(recipe, scripted_engine(policy)).run("Convert 3 miles to kilograms."))
    tool_messages = [m for m in result.trajectory.messages if m.role == "tool"]
    assert "cannot convert mi to kg" in str(tool_messages[0].content)
    assert result.reward == 0.0


# -- search_r1: search agent with exact match --------------------------------------------------------------------


@pytest.fixture(scope="module")
def search_smoke() -> search_smoke_mode.SmokeResult:
    return asyncio.run(search_smoke_mode.run_smoke(count=12, out=False))


def test_search_r1_finds_the_gold_passages_and_answers_exactly(search_smoke: search_smoke_mode.SmokeResult) -> None:
    episodes = search_smoke.episodes
    assert [e.reward for e in episodes] == [1.0] * len(episodes)
    assert all(e.gold_passages_found for e in episodes)
    assert all(e.answer and e.answer.startswith("<answer>") for e in episodes)
    two_hop = [e for e in episodes if len(e.queries) == 2]
    assert len(two_hop) == len(episodes) // 2  # the test split alternates single- and two-hop questions


def test_search_r1_data_is_shipped_small_and_reproducible() -> None:
    for name, text in search_data.build().items():
        shipped = (EXAMPLES / "search_r1" / "data" / name).read_text(encoding="utf-8")
        assert shipped == text, f"{name} differs from build_data.py's output; rerun it"
    corpus = EXAMPLES / "search_r1" / "data" / "corpus.jsonl"
    assert corpus.stat().st_size < 2_000_000
    assert 2000 <= len(corpus.read_text(encoding="utf-8").splitlines()) <= 5000


def test_search_r1_reward_is_normalized_exact_match_on_the_answer_tag() -> None:
    recipe = load_recipe(EXAMPLES / "search_r1" / "recipe.py")
    assert score(recipe, "<answer> the Niniabourk River. </answer>", ["Niniabourk", "Niniabourk River"]) == 1.0
    assert score(recipe, "<answer> Niniabourk Sea </answer>", ["Niniabourk", "Niniabourk River"]) == 0.0
    assert score(recipe, "Niniabourk", ["Niniabourk"]) == 0.0  # no <answer> tag, no credit


def test_search_r1_points_at_another_corpus_and_dataset(tmp_path: Path) -> None:
    from examples.search_r1.recipe import make_recipe

    (tmp_path / "wiki.jsonl").write_text(
        '{"id": "1", "contents": "\\"Paris\\"\\nParis is the capital and largest city of France."}\n'
        '{"id": "2", "contents": "\\"Lyon\\"\\nLyon is a city on the Rhone."}\n'
    )
    (tmp_path / "dev.jsonl").write_text('{"id": "q1", "question": "capital of france?", "golden_answers": ["Paris"]}\n')
    recipe = make_recipe(corpus=tmp_path / "wiki.jsonl", data=tmp_path)
    assert list(recipe.rows("dev")) == [{"prompt": "capital of france?", "references": ["Paris"], "id": "q1"}]

    def policy(prompt: Prompt) -> str:
        if not prompt.tool_results():
            return tool_call("local_search", {"query": prompt.question, "top_k": 1}, "Search for it.")
        return reply(f"<answer> {prompt.tool_results()[0].split(chr(34))[1]} </answer>", "Doc 1 says it.")

    row = next(recipe.rows("dev"))
    result = asyncio.run(runtime_for(recipe, scripted_engine(policy)).run(row["prompt"], task=row))
    assert result.final_answer == "<answer> Paris </answer>"
    assert result.reward == 1.0


@pytest.fixture
def retrieval_server() -> Iterator[str]:
    """A stand-in for Search-R1's retrieval server on loopback: its request and response shapes, two passages."""
    passages = ['"Paris"\nParis is the capital and largest city of France.', '"Lyon"\nLyon is a city on the Rhone.']
    seen: list[dict[str, object]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(request)
            hits = [p for p in passages if any(w in p.lower() for w in request["queries"][0].lower().split())]
            result = [[{"document": {"id": str(i), "contents": p}, "score": 1.0} for i, p in enumerate(hits)]]
            body = json.dumps({"result": result[: request["topk"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    finally:
        server.shutdown()
        server.server_close()
    assert seen and seen[0]["topk"] == 1 and seen[0]["return_scores"] is True


def _first_title_policy(prompt: Prompt) -> str:
    if not prompt.tool_results():
        return tool_call("local_search", {"query": "capital France", "top_k": 1}, "Search for it.")
    result = prompt.tool_results()[0]
    title = result.split("(Title: ", 1)[1].split(")", 1)[0] if "(Title: " in result else "unknown"
    return reply(f"<answer> {title} </answer>", "Doc 1 says it.")


def test_search_r1_uses_a_retrieval_server(retrieval_server: str, tmp_path: Path) -> None:
    from examples.search_r1.recipe import make_recipe

    (tmp_path / "test.jsonl").write_text(
        '{"question": "What is the capital of France?", "golden_answers": ["Paris"]}\n'
    )
    recipe = make_recipe(data=tmp_path, retriever_url=retrieval_server)
    row = next(recipe.rows("test"))
    result = asyncio.run(runtime_for(recipe, scripted_engine(_first_title_policy)).run(row["prompt"], task=row))
    tool_results = [str(m.content) for m in result.trajectory.messages if m.role == "tool"]
    assert tool_results == ["Doc 1 (Title: Paris) Paris is the capital and largest city of France."]
    assert result.reward == 1.0


def test_search_r1_survives_a_dead_retrieval_server(tmp_path: Path) -> None:
    from examples.search_r1.recipe import make_recipe

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "test.jsonl").write_text(
        '{"question": "What is the capital of France?", "golden_answers": ["Paris"]}\n'
    )
    recipe = make_recipe(data=tmp_path, retriever_url=f"http://127.0.0.1:{port}/retrieve")
    row = next(recipe.rows("test"))
    result = asyncio.run(runtime_for(recipe, scripted_engine(_first_title_policy)).run(row["prompt"], task=row))
    tool = next(m for m in result.trajectory.messages if m.role == "tool")
    assert "retrieval server" in str(tool.content) and "tool_error" in str(tool.content)
    assert result.final_answer == "<answer> unknown </answer>" and result.reward == 0.0


# -- single_turn: math with MathReward --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def math_smoke() -> math_smoke_mode.SmokeResult:
    return asyncio.run(math_smoke_mode.run_smoke(count=12, out=False))


def test_single_turn_answers_are_verified_mathematically(math_smoke: math_smoke_mode.SmokeResult) -> None:
    assert math_smoke.rewards == [1.0] * 12
    answers = [a or "" for a in math_smoke.answers]
    assert all("\\boxed{" in a for a in answers)
    # at least one answer is written differently from its reference, and still scores 1.0
    assert any(gold not in answer for gold, answer in zip(math_smoke.expected, answers, strict=True))


def test_single_turn_math_reward_accepts_equivalents_only(math_smoke: math_smoke_mode.SmokeResult) -> None:
    assert math_smoke.graded == list(math_smoke_mode.GRADED)


def test_single_turn_data_is_reproducible() -> None:
    for name, text in math_data.build().items():
        assert (EXAMPLES / "single_turn" / "data" / name).read_text(encoding="utf-8") == text, name


# -- compact: an episode longer than its context ------------------------------------------------------------------


@pytest.fixture(scope="module")
def compact_smoke() -> compact_smoke_mode.SmokeResult:
    return asyncio.run(compact_smoke_mode.run_smoke(count=4, out=False))


def test_compact_served_stream_shows_each_compaction_and_the_answer(
    compact_smoke: compact_smoke_mode.SmokeResult,
) -> None:
    served = compact_smoke.served
    assert served.answer == f"Answer: {compact_smoke.expected}" and served.finish_reason == "stop"
    assert len(served.summaries) >= 2
    assert all("crates so far" in s for s in served.summaries)
    assert {"assistant", "tool_call", "tool_result", "compaction"} <= set(served.event_types)
    assert served.event_types[-1] == "final"
    assert any(line.startswith("[compaction] segment 1 starts") for line in served.lines)
    # a live request carries no reference answer: the server's exact-match reward has nothing to match
    assert served.reward == served.trajectory.reward == 0.0
    assert served.scored == 1.0  # the served answer, scored against the row's reference with the recipe's rewards


def test_compact_server_logs_one_segment_per_context(compact_smoke: compact_smoke_mode.SmokeResult) -> None:
    from examples.compact.recipe import MAX_CONTEXT_TOKENS

    served = compact_smoke.served
    trajectory = served.trajectory
    assert trajectory.stop_reason == "final_answer" and trajectory.final_answer == served.answer
    assert len(trajectory.segments) == trajectory.compactions + 1 == len(served.summaries) + 1 >= 3
    tokenizer = qwen3_tokenizer()
    for index, segment in enumerate(trajectory.segments):
        assert len(segment.ids) <= MAX_CONTEXT_TOKENS
        assert segment.action_ranges and all(0 < a < b <= len(segment.ids) for a, b in segment.action_ranges)
        assert sum(segment.loss_mask) == sum(b - a for a, b in segment.action_ranges)
        if index > 0:  # a compacted context starts from the previous summary
            prompt = tokenizer.decode(segment.ids[: segment.action_ranges[0][0]])
            assert served.summaries[index - 1] in prompt


def test_compact_executor_trains_the_served_last_segment(compact_smoke: compact_smoke_mode.SmokeResult) -> None:
    served = compact_smoke.served.trajectory
    last = served.segments[-1]
    sample = compact_smoke.executed.sample
    assert [int(i) for i in sample["observation_tokens"]] == last.ids  # training = inference, token for token
    assert sample["action_ranges"] == [tuple(r) for r in last.action_ranges]
    assert sample["rollout_log_probs"] == [-0.25 if m else 0.0 for m in last.loss_mask]
    assert sample["reward"] == 1.0 and sample["truncated"] is False
    assert sample["extra_logs"]["agent_compactions"] == served.compactions >= 1
    assert compact_smoke.executed.rollout_engine_calls == served.usage.generations  # one vLLM call per turn


def test_compact_executor_rollout_is_the_served_episode(compact_smoke: compact_smoke_mode.SmokeResult) -> None:
    served, executed = compact_smoke.served.trajectory, compact_smoke.executed.trajectory
    assert [(s.ids, s.loss_mask) for s in executed.segments] == [(s.ids, s.loss_mask) for s in served.segments]
    assert (executed.compactions, executed.turns, executed.tool_calls, executed.final_answer) == (
        served.compactions, served.turns, served.tool_calls, served.final_answer,
    )  # fmt: skip
    assert executed.reward == 1.0


def test_compact_batch_answers_every_logbook(compact_smoke: compact_smoke_mode.SmokeResult) -> None:
    assert compact_smoke.batch_rewards == [1.0] * 4
    assert min(compact_smoke.batch_compactions) >= 2


def test_compact_smoke_stops_its_server_and_says_whether_it_held(
    compact_smoke: compact_smoke_mode.SmokeResult,
) -> None:
    assert not [t for t in threading.enumerate() if t.name == "smoke-server" and t.is_alive()]
    assert compact_smoke.ok
    executed = compact_smoke.executed
    shorter = {**executed.sample, "observation_tokens": executed.sample["observation_tokens"][:-1]}
    assert not dataclasses.replace(compact_smoke, executed=dataclasses.replace(executed, sample=shorter)).ok
    assert not dataclasses.replace(compact_smoke, batch_rewards=[1.0, 0.0, 1.0, 1.0]).ok


def test_compact_task_does_not_fit_without_compaction() -> None:
    recipe = load_recipe(EXAMPLES / "compact" / "recipe.py")
    assert isinstance(recipe.context, CompactionPolicy)
    plain = dataclasses.replace(recipe, context=BudgetPolicy())
    row = next(recipe.rows("test"))
    engine = scripted_engine(compact_smoke_mode.make_policy(recipe.context.instruction_text))
    result = asyncio.run(runtime_for(plain, engine).run(row["prompt"], task=row))
    assert result.stop_reason == "context_exhausted"
    assert result.reward == 0.0
