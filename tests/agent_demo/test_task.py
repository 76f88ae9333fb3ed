"""The demo task: seeded problems, a held-out split disjoint from training, questions that parse back, answers
that the real calculator agrees with, and the recipe that carries it all."""

from __future__ import annotations

import asyncio

import pytest

from agent_demo.task import generate_problems, parse_question, problem_rows, split_of, template_count
from agent_env.tools.calculator import evaluate, format_number
from agent_runtime import Recipe, load_recipe


def test_generation_is_reproducible_and_distinct() -> None:
    first = generate_problems("train", 300, seed=7)
    assert first == generate_problems("train", 300, seed=7)
    assert first != generate_problems("train", 300, seed=8)
    assert len({(p.a, p.b, p.c, p.op) for p in first}) == 300


def test_held_out_problems_never_appear_in_training() -> None:
    train = {(p.a, p.b, p.c, p.op) for seed in range(3) for p in generate_problems("train", 3000, seed=seed)}
    test = {(p.a, p.b, p.c, p.op) for seed in range(3) for p in generate_problems("test", 500, seed=seed)}
    assert train and test and not train & test
    assert all(split_of(*key) == "test" for key in test)


def test_answers_agree_with_the_calculator_tool() -> None:
    for problem in generate_problems("test", 200, seed=0):
        assert format_number(evaluate(problem.expression)) == problem.answer
        assert 4 <= len(problem.answer) <= 8  # too large for a tiny model to compute in its head


def test_questions_parse_back_to_their_problem() -> None:
    problems = generate_problems("train", 200, seed=1)
    assert {p.template for p in problems} == set(range(template_count()))  # every template occurs
    for problem in problems:
        assert parse_question(problem.question) == problem
        assert parse_question(f"  {problem.question}\n") == problem
    assert parse_question("What is the capital of France?") is None
    assert parse_question("What is 12 * 34 + 5? And more") is None


def test_rows_carry_prompt_and_reference() -> None:
    row = next(iter(problem_rows("heldout", 1)))
    assert set(row) == {"prompt", "answer", "expression", "phrasing"}
    assert row == next(iter(problem_rows("test", 1)))
    with pytest.raises(ValueError, match="unknown split"):
        next(iter(problem_rows("dev", 1)))
    with pytest.raises(ValueError, match="split must be"):
        generate_problems("dev", 1)  # type: ignore[arg-type]


def test_the_recipe_loads_by_module_path_and_scores_answers() -> None:
    recipe = load_recipe("agent_demo.recipe")
    assert isinstance(recipe, Recipe)
    assert recipe.chat_protocol().name == "qwen3-instruct-2507"
    assert [t.name for t in recipe.environment().tools] == ["calculator"]
    held_out = list(recipe.rows("test"))
    assert len(held_out) >= 200
    train_keys = {r["expression"] for r in recipe.rows("train")}
    assert not train_keys & {r["expression"] for r in held_out}

    from agent_env import EpisodeRecord

    async def score(answer: str, reference: str) -> float:
        assert recipe.rewards is not None
        breakdown = await recipe.rewards.score(EpisodeRecord(final_answer=answer, references=(reference,)))
        return breakdown.total

    assert asyncio.run(score("The answer is 1688392.", "1688392")) == 1.0
    assert asyncio.run(score("The answer is 1,688,392.", "1688392")) == 1.0
    assert asyncio.run(score("The answer is 1688393.", "1688392")) == 0.0
    assert asyncio.run(score("1688392", "1688392")) == 0.0  # the answer must be stated
