"""Recipes: one file defines the agent; loading errors name the file and the problem."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, CompactableSession, ScriptedEngine
from agent_runtime.recipe import Recipe, RecipeError, load_recipe, read_jsonl_rows
from tests.agent_runtime.test_session import answer, call

RECIPE = """
from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
from agent_runtime.recipe import Compaction, Recipe

recipe = Recipe(
    name="calc",
    protocol="qwen3",
    environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
    rewards=RewardPipeline(result=[MatchingReward()]),
    max_new_tokens=128,
    compaction=COMPACTION,
    dataset=DATASET,
)
"""


def write_recipe(tmp_path: Path, *, compaction: str = "None", dataset: str = "None") -> Path:
    path = tmp_path / "my_recipe.py"
    path.write_text(RECIPE.replace("COMPACTION", compaction).replace("DATASET", dataset))
    return path


def test_a_recipe_file_defines_the_session(tmp_path: Path, qwen3_tokenizer_file: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path))
    assert recipe.name == "calc"
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_file)
    engine = ScriptedEngine(tokenizer, [call("6 * 7"), answer("42")])
    result = asyncio.run(AgentRuntime(engine, recipe.make_session()).run("6*7?", task={"answer": "42"}))
    assert result.final_answer == "42" and result.reward == 1.0


def test_compaction_makes_a_compactable_session(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, compaction="Compaction(max_compactions=2)"))
    session = recipe.make_session()
    assert isinstance(session, CompactableSession) and session.max_compactions == 2


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
