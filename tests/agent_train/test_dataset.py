"""Dataset preparation: rows become OpenRLHF's prompt JSONL that the executor decodes back into the same task;
bad rows are reported with file, line and field, and nothing is written."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from agent_train import (
    INPUT_KEY,
    LABEL_KEY,
    AgentTask,
    DatasetError,
    decode_task,
    prepare_jsonl_dataset,
    prepare_recipe_dataset,
)
from tests.agent_train.conftest import calculator_recipe

ROWS: list[dict[str, Any]] = [
    {"prompt": "What is 6 * 7?", "answer": "42", "level": 1},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "answer": 4},
    {"prompt": "Name two primes.", "references": ["2", "3"]},
    {"prompt": "No label here."},
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_rows_round_trip_through_the_prepared_file(tmp_path: Path) -> None:
    out = tmp_path / "out" / "train.jsonl"
    assert prepare_jsonl_dataset(write_jsonl(tmp_path / "in.jsonl", ROWS), out) == 4
    lines = read_jsonl(out)
    assert all(set(line) == {INPUT_KEY, LABEL_KEY} for line in lines)
    assert all(isinstance(line[INPUT_KEY], str) for line in lines)  # one string column: no Arrow schema games
    assert [line[LABEL_KEY] for line in lines] == ["42", "4", '["2","3"]', ""]
    tasks = [decode_task(line[INPUT_KEY], line[LABEL_KEY], vision=True) for line in lines]
    assert tasks[0] == AgentTask(prompt="What is 6 * 7?", row={"answer": "42", "level": 1})
    assert tasks[1].prompt == ROWS[1]["prompt"] and tasks[1].row == {"answer": 4}
    assert tasks[2].row == {"references": ["2", "3"]}
    assert out.stat().st_mode & 0o777 == 0o644


def test_keys_can_be_renamed(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [{"question": "1+1?", "solution": "2"}])
    out = tmp_path / "out.jsonl"
    prepare_jsonl_dataset(source, out, prompt_key="question", label_key="solution")
    (line,) = read_jsonl(out)
    assert decode_task(line[INPUT_KEY]) == AgentTask(prompt="1+1?", row={"answer": "2"})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"answer": "1"}, r"in\.jsonl:3: field 'prompt' is missing"),
        ({"prompt": "  "}, r"in\.jsonl:3: field 'prompt' is an empty string"),
        ({"prompt": 7}, r"in\.jsonl:3: field 'prompt' must be a string or a list of messages, got int"),
        ({"prompt": [{"role": "user", "content": "hi"}, {"content": "x"}]}, r"in\.jsonl:3: field 'prompt\[1\]"),
        ({"prompt": [{"role": "robot", "content": "x"}]}, r"in\.jsonl:3: field 'prompt\[0\]\.role'"),
        (["not", "an", "object"], r"in\.jsonl:3: a row must be a JSON object, got list"),
    ],
)
def test_bad_rows_name_the_line_and_the_field(tmp_path: Path, bad: Any, message: str) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [ROWS[0], ROWS[1], bad])
    out = tmp_path / "out.jsonl"
    with pytest.raises(DatasetError, match=message):
        prepare_jsonl_dataset(source, out)
    assert not out.exists() and list(tmp_path.iterdir()) == [source]  # nothing written, no scratch file left


def test_invalid_json_and_missing_renamed_keys(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "ok"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"in\.jsonl:2: not valid JSON"):
        prepare_jsonl_dataset(source, tmp_path / "out.jsonl")
    write_jsonl(source, [{"prompt": "ok"}])
    with pytest.raises(DatasetError, match=r"in\.jsonl:1: field 'solution' \(the label\) is missing"):
        prepare_jsonl_dataset(source, tmp_path / "out.jsonl", label_key="solution")
    with pytest.raises(DatasetError, match="does not exist"):
        prepare_jsonl_dataset(tmp_path / "nope.jsonl", tmp_path / "out.jsonl")


def test_recipe_datasets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "train.jsonl", ROWS[:2])
    write_jsonl(data / "test.jsonl", [{"prompt": 3}])
    recipe = calculator_recipe(dataset=str(data))
    assert prepare_recipe_dataset(recipe, tmp_path / "train.jsonl") == 2
    with pytest.raises(DatasetError, match=r"test\.jsonl:1: field 'prompt'"):
        prepare_recipe_dataset(recipe, tmp_path / "test.jsonl", split="test")

    generated = calculator_recipe(dataset=lambda split: [{"prompt": f"{split} question", "answer": "1"}])
    assert prepare_recipe_dataset(generated, tmp_path / "gen.jsonl", split="dev") == 1
    bad = calculator_recipe(dataset=lambda split: [{"prompt": "fine"}, {"prompt": ""}])
    with pytest.raises(DatasetError, match=r"calc:train\[1\]: field 'prompt' is an empty string"):
        prepare_recipe_dataset(bad, tmp_path / "bad.jsonl")
    with pytest.raises(DatasetError, match="defines no dataset"):
        prepare_recipe_dataset(calculator_recipe(), tmp_path / "none.jsonl")


def test_decode_task_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="empty"):
        decode_task("")
    with pytest.raises(ValueError, match="string or a list of messages"):
        decode_task({"prompt": "x"})
    with pytest.raises(ValueError, match="malformed agent task"):
        decode_task('{"kind":"agent_task","row":{}}')
    assert decode_task("Hi", "") == AgentTask(prompt="Hi", row={})


def test_rows_with_images_are_prepared_for_vision_recipes_and_refused_for_text_only_ones(tmp_path: Path) -> None:
    from tests.agent_protocol.families.test_qwen3_vl import data_url

    image = {"type": "image_url", "image_url": {"url": data_url(4, 3)}}
    in_messages = {
        "prompt": [{"role": "user", "content": [image, {"type": "text", "text": "Colour?"}]}],
        "answer": "grey",
    }
    in_column = {"prompt": "Colour?", "images": [data_url(4, 3)], "answer": "grey"}
    vision = dataclasses.replace(calculator_recipe(dataset=lambda split: [in_messages, in_column]), protocol="qwen3-vl")
    assert prepare_recipe_dataset(vision, tmp_path / "vision.jsonl") == 2
    tasks = [
        decode_task(line[INPUT_KEY], line[LABEL_KEY], vision=True) for line in read_jsonl(tmp_path / "vision.jsonl")
    ]
    assert isinstance(tasks[0].prompt, list) and tasks[0].prompt[0]["content"][0] == image
    assert isinstance(tasks[1].prompt, list) and tasks[1].prompt[0]["content"][0] == image  # placed first
    for row, field in ((in_messages, r"prompt\[0\]\.content\[0\]"), (in_column, "images")):
        text_only = calculator_recipe(dataset=lambda split, row=row: [row])
        with pytest.raises(DatasetError, match=rf"calc:train\[0\]: field '{field}'.*text-only"):
            prepare_recipe_dataset(text_only, tmp_path / "text.jsonl")
        assert not (tmp_path / "text.jsonl").exists()
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    bad = dataclasses.replace(vision, dataset=lambda split: [{"prompt": [{"role": "user", "content": [remote]}]}])
    with pytest.raises(DatasetError, match=r"field 'prompt\[0\]\.content\[0\]\.image_url\.url': https image URLs"):
        prepare_recipe_dataset(bad, tmp_path / "bad.jsonl")
