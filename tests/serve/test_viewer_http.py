"""The trajectory viewer's endpoints over HTTP (a real uvicorn server, httpx): pages of summaries with filters
and `next_offset` over a file larger than a page, malformed lines skipped and counted, one record's tokens exactly
as logged (ids, loss mask, logprobs, the real tokenizer's pieces), and the errors: a bad offset or limit, an
unknown id, a path that tries to leave the trajectories, a path that does not exist. Also a served agent's own
``/viewer`` over its ``--trajectory-log``, behind its API key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime.serving import TrajectoryFiles, TrajectoryFilesError, create_viewer_app
from tests.serve.conftest import LiveServer, ServerFactory
from tests.serve.viewer_records import calculator_log, compacted_log, copies, read_trajectories, step_file


@pytest.fixture(scope="module")
def runs(start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/calc.jsonl (3 answered, 1 failed), runs/compacted.jsonl, runs/big/many.jsonl (the calculator's
    records 40 times over, with malformed lines), runs/steps/step_{10,20}.jsonl (the same tasks at two steps)."""
    root = tmp_path_factory.mktemp("runs")
    calc = calculator_log(start_server, root / "calc.jsonl")
    compacted_log(tokenizer, root / "compacted.jsonl")
    (root / "big").mkdir()
    copies(calc, root / "big" / "many.jsonl", 40, malformed_every=10)
    (root / "steps").mkdir()
    step_file(calc, root / "steps" / "step_10.jsonl", 10)
    step_file(calc, root / "steps" / "step_20.jsonl", 20)
    (root / "notes.txt").write_text("not a trajectory file")
    (root / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n' * 50)  # a run's metrics: no trajectories
    (root / ".hidden").mkdir()
    copies(calc, root / ".hidden" / "copy.jsonl", 1)
    return root


@pytest.fixture(scope="module")
def viewer(runs: Path, tokenizer: HFTokenizer) -> Iterator[LiveServer]:
    server = LiveServer(create_viewer_app(runs, tokenizer=tokenizer)).start()
    yield server
    server.stop()


def get(server: LiveServer, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", params=params, timeout=30)


def test_pages_cover_every_record_once_and_count_the_malformed_lines(viewer: LiveServer) -> None:
    seen: list[str] = []
    offset, pages = 0, 0
    while True:
        page = get(viewer, "/trajectories", offset=offset, limit=37).json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        offset = page["next_offset"]
        if page["done"]:
            break
    files = {f["name"]: (f["records"], f["foreign"]) for f in page["files"]}
    assert files == {"big/many.jsonl": (160, False), "calc.jsonl": (4, False), "compacted.jsonl": (1, False),
                     "metrics.jsonl": (0, True), "steps/step_10.jsonl": (4, False),
                     "steps/step_20.jsonl": (4, False)}  # fmt: skip
    assert len(seen) == len(set(seen)) == 173 and pages == 5
    assert page["malformed"] == 4  # copies 0, 10, 20, 30: one bad line each
    assert {(m["file"], m["line"]) for m in page["malformed_lines"]} == {
        ("big/many.jsonl", 5), ("big/many.jsonl", 46), ("big/many.jsonl", 87), ("big/many.jsonl", 128)
    }  # fmt: skip


def test_the_first_page_reads_only_what_it_shows(runs: Path, tokenizer: HFTokenizer) -> None:
    files = TrajectoryFiles(runs / "big" / "many.jsonl", tokenizer=tokenizer)
    page = files.page(0, 10)
    assert len(page["items"]) == 10 and page["next_offset"] == 10 and not page["done"]
    assert page["indexed"] < 160  # read ahead a little, never the whole file


def test_filters_by_reward_stop_reason_error_code_and_file(viewer: LiveServer) -> None:
    def ids(**params: Any) -> list[dict[str, Any]]:
        page = get(viewer, "/trajectories", limit=500, **params).json()
        assert page["done"]
        items: list[dict[str, Any]] = page["items"]
        return items

    failed = ids(error_code="engine_error")
    assert len(failed) == 1 + 40 + 2 and all(i["error_codes"] == ["engine_error"] for i in failed)
    assert all("explode" in i["task"] for i in failed)
    clean = ids(error_code="none")
    assert len(clean) == 173 - 43 and not any(i["error_codes"] for i in clean)
    answered = ids(stop_reason="final_answer")
    assert len(answered) == 130 and all(i["stop_reason"] == "final_answer" for i in answered)
    assert ids(min_reward=0.5) == [i for i in ids() if i["reward"] >= 0.5]
    assert ids(max_reward=-1) == []
    compacted = ids(file=2)
    assert ids(file=3) == []  # metrics.jsonl
    assert [i["compactions"] for i in compacted] == [1] and compacted[0]["file"] == "compacted.jsonl"


def test_the_same_task_under_two_checkpoints(viewer: LiveServer) -> None:
    first = get(viewer, "/trajectories", file=4, limit=1).json()["items"][0]
    same = get(viewer, "/trajectories", task_key=first["task_key"], limit=500).json()["items"]
    checkpoints = {i["checkpoint"] for i in same}
    assert {"steps/step_10.jsonl step 10", "steps/step_20.jsonl step 20", "calc.jsonl"} <= checkpoints
    assert all(i["task"] == first["task"] for i in same)


def test_a_record_is_its_tokens_exactly_as_logged(viewer: LiveServer, runs: Path, tokenizer: HFTokenizer) -> None:
    logged = read_trajectories(runs / "calc.jsonl")[0]
    item = get(viewer, "/trajectories", file=1, limit=1).json()["items"][0]
    record = get(viewer, f"/trajectories/{item['id']}").json()
    assert record["episode_id"] == logged.episode_id and record["summary"]["id"] == item["id"]
    [segment] = record["segments"]
    [stored] = logged.segments
    assert segment["ids"] == stored.ids and segment["loss_mask"] == stored.loss_mask
    assert segment["logprobs"] == stored.logprobs
    assert segment["pieces"] == [tokenizer.decode([i]) for i in stored.ids]
    assert "".join(segment["pieces"]) == tokenizer.decode(stored.ids)
    assert record["reward"] == logged.reward and record["stop_reason"] == "final_answer"
    tool = [m for m in record["messages"] if m["role"] == "tool"]
    assert tool and tool[0]["content"]  # the calculator's result


def test_a_compacted_record_marks_its_boundary_and_summary(viewer: LiveServer, runs: Path) -> None:
    item = get(viewer, "/trajectories", file=2).json()["items"][0]
    record = get(viewer, f"/trajectories/{item['id']}").json()
    first, second = record["segments"]
    logged = read_trajectories(runs / "compacted.jsonl")[0]
    assert first["summary_range"] == list(logged.segments[0].action_ranges[-1])
    start, end = first["summary_range"]
    assert "".join(first["pieces"][start:end]).startswith("I computed 17 * 23")
    assert second["summary"].startswith("I computed 17 * 23") and second["summary_range"] is None
    assert first["summary"] is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"offset": -1}, "`offset` must be at least 0"),
        ({"offset": "x"}, "`offset` must be an integer"),
        ({"limit": 0}, "`limit` must be between 1 and 500"),
        ({"limit": 501}, "`limit` must be between 1 and 500"),
        ({"min_reward": "nan"}, "`min_reward` must be a finite number"),
        ({"max_reward": "high"}, "`max_reward` must be a finite number"),
        ({"file": "-2"}, "`file` must be at least 0"),
    ],
)
def test_bad_parameters_are_400_naming_them(viewer: LiveServer, params: dict[str, Any], message: str) -> None:
    response = get(viewer, "/trajectories", **params)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "record_id",
    ["0:1", "99:0", "0:99999999", "nonsense", "..%2F..%2Fetc%2Fpasswd", "../../etc/passwd", "0:-1", "%2Fetc%2Fpasswd"],
)
def test_an_id_the_index_never_gave_is_404(viewer: LiveServer, record_id: str) -> None:
    response = httpx.get(f"{viewer.url}/trajectories/{record_id}", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] in ("trajectory_not_found", "not_found")
    assert "root:" not in response.text


def test_a_symlink_out_of_the_directory_is_not_read(tmp_path: Path, runs: Path) -> None:
    inside = tmp_path / "inside"
    inside.mkdir()
    (inside / "outside.jsonl").symlink_to(runs / "calc.jsonl")
    page = TrajectoryFiles(inside).page()
    assert page["files"] == [] and page["items"] == []


def test_a_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TrajectoryFilesError, match="no such file or directory"):
        create_viewer_app(tmp_path / "nowhere.jsonl")
    with pytest.raises(TrajectoryFilesError, match="path is empty"):
        create_viewer_app("")


def test_a_line_being_written_is_left_for_later(tmp_path: Path, runs: Path) -> None:
    log = tmp_path / "live.jsonl"
    whole = (runs / "calc.jsonl").read_bytes().splitlines(keepends=True)
    log.write_bytes(whole[0] + whole[1][:50])
    files = TrajectoryFiles(log)
    assert len(files.page()["items"]) == 1 and files.page()["malformed"] == 0
    log.write_bytes(whole[0] + whole[1])
    page = files.page()
    assert len(page["items"]) == 2 and page["done"]
    unended = tmp_path / "unended.jsonl"  # a file written without a last newline: its last record still counts
    unended.write_bytes(whole[0] + whole[1].rstrip(b"\n"))
    assert len(TrajectoryFiles(unended).page()["items"]) == 2


def test_a_served_agent_shows_its_own_log_behind_its_key(start_server: ServerFactory, tmp_path: Path) -> None:
    log = tmp_path / "served.jsonl"
    server = start_server(trajectory_log=str(log), api_key="secret")
    assert httpx.get(f"{server.url}/viewer", timeout=10).status_code == 200
    assert httpx.get(f"{server.url}/trajectories", timeout=10).status_code == 401
    key = {"Authorization": "Bearer secret"}
    assert httpx.get(f"{server.url}/trajectories", headers=key, timeout=10).json()["items"] == []
    reply = httpx.post(
        f"{server.url}/v1/chat/completions", headers=key, timeout=30,
        json={"model": "calculator-agent", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    )  # fmt: skip
    assert reply.status_code == 200
    for _ in range(200):
        items = httpx.get(f"{server.url}/trajectories", headers=key, timeout=10).json()["items"]
        if items:
            break
    assert [i["task"] for i in items] == ["What is 2 + 3?"]
    record = httpx.get(f"{server.url}/trajectories/{items[0]['id']}", headers=key, timeout=10).json()
    assert record["segments"][0]["pieces"] is not None  # the served model's tokenizer decodes the pieces


def test_in_a_directory_the_last_file_is_read_on_and_earlier_ones_keep_their_numbers(
    tmp_path: Path, runs: Path
) -> None:
    whole = (runs / "calc.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_bytes(whole[0])
    (tmp_path / "b.jsonl").write_bytes(whole[1])
    files = TrajectoryFiles(tmp_path)
    first = files.page()
    assert [i.file for i in first["items"]] == ["a.jsonl", "b.jsonl"] and first["done"]
    with open(tmp_path / "a.jsonl", "ab") as a, open(tmp_path / "b.jsonl", "ab") as b:
        a.write(whole[2])
        b.write(whole[3])
    page = files.page()
    assert [(i.file, i.index) for i in page["items"]] == [("a.jsonl", 0), ("b.jsonl", 1), ("b.jsonl", 2)]
    assert page["done"] and len({i.id for i in page["items"]}) == 3
