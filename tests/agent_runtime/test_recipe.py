"""Recipes: one file defines the agent; loading errors name the file and the problem."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, BudgetPolicy, CompactionPolicy, ContextPolicy, ScriptedEngine
from agent_runtime.recipe import Compaction, Recipe, RecipeError, load_recipe, read_jsonl_rows
from tests.agent_runtime.test_session import answer, call

RECIPE = """
from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_runtime import CompactionPolicy
from agent_runtime.recipe import Recipe

recipe = Recipe(
    name="calc",
    protocol="qwen3",
    environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
    rewards=RewardPipeline(result=[MatchingReward()]),
    max_new_tokens=128,
    context=CONTEXT,
    dataset=DATASET,
)
"""


def write_recipe(
    tmp_path: Path, *, context: str = "CompactionPolicy(max_compactions=0)", dataset: str = "None"
) -> Path:
    path = tmp_path / "my_recipe.py"
    path.write_text(RECIPE.replace("CONTEXT", context).replace("DATASET", dataset))
    return path


def test_a_recipe_file_defines_the_session(tmp_path: Path, qwen3_tokenizer_file: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path))
    assert recipe.name == "calc"
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    engine = ScriptedEngine(tokenizer, [call("6 * 7"), answer("42")])
    result = asyncio.run(AgentRuntime(engine, recipe.make_session()).run("6*7?", task={"answer": "42"}))
    assert result.final_answer == "42" and result.reward == 1.0


def test_the_context_policy_is_the_sessions(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, context="CompactionPolicy(max_compactions=2)"))
    assert recipe.make_session().context == CompactionPolicy(max_compactions=2)
    assert isinstance(Recipe(name="plain").make_session().context, BudgetPolicy)  # the default: the plain budget


def test_a_recipe_takes_a_policy_of_ones_own_and_refuses_anything_else() -> None:
    class Mine(ContextPolicy):
        pass

    assert isinstance(Recipe(name="mine", context=Mine()).make_session().context, Mine)
    with pytest.raises(RecipeError, match="not a ContextPolicy"):
        Recipe(name="bad", context="compaction")  # type: ignore[arg-type]


def test_compaction_settings_are_a_deprecated_spelling_of_the_policy() -> None:
    settings = Compaction(compact_at_tokens=300, max_compactions=2, instruction="Sum up.")
    with pytest.warns(DeprecationWarning, match=r"context=CompactionPolicy"):
        recipe = Recipe(name="old", compaction=settings)
    policy = CompactionPolicy(compact_at_tokens=300, max_compactions=2, instruction_text="Sum up.")
    assert recipe.context == policy and recipe.make_session().context == policy
    assert recipe.generation_cap() == max(recipe.max_new_tokens, policy.summary_max_new_tokens)
    # `replace` keeps the policy unless told otherwise; either spelling changes it
    assert dataclasses.replace(recipe, max_new_tokens=64).context == policy
    assert isinstance(dataclasses.replace(recipe, context=BudgetPolicy()).context, BudgetPolicy)
    with pytest.warns(DeprecationWarning):
        assert dataclasses.replace(recipe, compaction=Compaction(max_compactions=1)).context.max_compactions == 1  # type: ignore[attr-defined]


def test_dataset_rows(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n\n")
    recipe = load_recipe(write_recipe(tmp_path, dataset=repr(str(data))))
    assert list(recipe.rows("train")) == [{"prompt": "1+1?", "answer": "2"}]
    with pytest.raises(RecipeError, match=r"test\.jsonl does not exist"):
        list(recipe.rows("test"))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"prompt": ""}\n', r"rows\.jsonl:1: a dataset row needs a non-empty 'prompt'"),
        ("not json\n", r"rows\.jsonl:1: not valid JSON"),
        ("[1, 2]\n", r"rows\.jsonl:1: a row must be a JSON object"),
    ],
)
def test_bad_dataset_rows_name_the_line(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(content)
    with pytest.raises(RecipeError, match=match):
        list(read_jsonl_rows(path))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("x = 1\n", "defines no recipe"),
        ("recipe = 3\n", "recipe is a int, not a Recipe"),
        ("import no_such_module_anywhere\n", "failed to import: ModuleNotFoundError"),
    ],
)
def test_bad_recipe_files(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.py"
    path.write_text(content)
    with pytest.raises(RecipeError, match=match):
        load_recipe(path)


def test_missing_recipe_file_and_module() -> None:
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe("nowhere/recipe.py")
    with pytest.raises(RecipeError, match="cannot import recipe module"):
        load_recipe("no_such_package.recipes")


def test_make_recipe_function_and_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pkg_recipes.py").write_text(
        "from agent_env import SingleTurnEnvironment\nfrom agent_runtime.recipe import Recipe\n"
        "def make_recipe():\n    return Recipe(name='single', environment=SingleTurnEnvironment)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_recipe("pkg_recipes").name == "single"
    assert load_recipe("pkg_recipes:make_recipe").name == "single"
    assert isinstance(load_recipe("pkg_recipes"), Recipe)
