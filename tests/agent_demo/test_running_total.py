"""The compaction demo's task and scripted expert: the expert solves every list through the recipe's own
`CompactableSession`, each held-out list needs at least two compactions, and without compaction the budget ends
every held-out episode before its answer (what the demo's "compaction off" figure measures)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from agent_demo import running_total
from agent_demo.running_total import TotalProblem, generate_totals, parse_numbers, summary_text
from agent_demo.running_total_expert import RunningTotalExpert, episode_pieces, train_running_total_tokenizer
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, Recipe, ScriptedEngine, Trajectory


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    recipe = running_total.make_recipe()
    return HFTokenizer(train_running_total_tokenizer(recipe.chat_protocol(), recipe.environment().tools, episodes=300))


def _expert_episodes(recipe: Recipe, tokenizer: HFTokenizer, split: str, count: int) -> list[Trajectory]:
    engine = ScriptedEngine(tokenizer, policy=RunningTotalExpert(tokenizer, recipe.chat_protocol()))
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
    rows = list(recipe.rows(split))[:count]
    results = asyncio.run(runtime.run_many([row["prompt"] for row in rows], tasks=rows))
    return [result.trajectory for result in results]


def test_the_split_is_fixed_by_the_list_and_the_lists_read_back() -> None:
    train = generate_totals("train", 300)
    test = generate_totals("test", 300)
    assert not {p.numbers for p in train} & {p.numbers for p in test}
    assert all(p.split == "test" and 8 <= len(p.numbers) <= 9 for p in test)
    assert {len(p.numbers) for p in train} == set(range(4, 10))
    for problem in train[:50]:
        assert len(set(problem.numbers)) == len(problem.numbers) and 0 not in problem.numbers
        assert parse_numbers(problem.question) == problem.numbers
        assert problem.row()["answer"] == str(sum(problem.numbers))
    assert parse_numbers("What is 3 * 4?") is None and parse_numbers(running_total.QUESTION_PREFIX + "12a") is None
    assert summary_text(12, [3, 8]) == "Total 12. Left: 38." and summary_text(45, []) == "Total 45. Left: none."


def test_the_expert_compacts_at_the_threshold_and_solves_every_list(tokenizer: HFTokenizer) -> None:
    recipe = running_total.make_recipe()
    held_out = _expert_episodes(recipe, tokenizer, "test", 200)
    assert all(t.reward == 1.0 and t.stop_reason == "final_answer" for t in held_out)
    assert min(t.compactions for t in held_out) >= running_total.MIN_HELD_OUT_COMPACTIONS
    assert all(len(s.ids) <= running_total.MAX_CONTEXT_TOKENS for t in held_out for s in t.segments)
    summaries = [
        m.content for t in held_out for m in t.messages if m.role == "assistant" and m.content.startswith("Total ")
    ]
    assert len(summaries) == sum(t.compactions for t in held_out)
    train = _expert_episodes(recipe, tokenizer, "train", 200)
    assert all(t.reward == 1.0 for t in train)
    assert set(Counter(t.compactions for t in train)) >= {1, 2}  # short lists compact less; SFT sees every count


def test_without_compaction_the_budget_ends_every_held_out_episode(tokenizer: HFTokenizer) -> None:
    episodes = _expert_episodes(running_total.make_recipe(compaction=False), tokenizer, "test", 50)
    assert all(t.stop_reason == "context_exhausted" and t.reward == 0.0 for t in episodes)


def test_the_tokenizer_corpus_shows_every_kind_of_piece() -> None:
    recipe = running_total.make_recipe()
    problem = TotalProblem(numbers=(4, 7, 1, 9, 3, 8, 2, 5, 6))
    pieces = episode_pieces(problem, recipe.chat_protocol(), recipe.environment().tools, random.Random(0))
    text = "".join(pieces)
    assert running_total.COMPACTION_INSTRUCTION in text and "So far: Total " in text
    assert '"expression": "4 + 7"' in text and text.endswith("The answer is 45.<|im_end|>")
