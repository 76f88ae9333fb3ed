"""What a served agent-mode request logs, on a real server: a plain answer is one ``request_served`` line that
carries its episode (id, stop reason, turns, reward: the fields the runtime's ``episode_finished`` line had, which
the server no longer writes for it); a streamed one keeps the runtime's line; a failed one says ``request_failed``
with its code. One line instead of two is a part of issue 43's CPU cut (bench/bench_serve.py)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from agent_protocol import HFTokenizer
from agent_runtime import EngineError, ScriptedEngine, read_trajectories
from tests.serve.conftest import MODEL, ServerFactory

USER = [{"role": "user", "content": "What is 2 * 21?"}]


@pytest.fixture
def logged() -> Iterator[list[MutableMapping[str, Any]]]:
    with structlog.testing.capture_logs() as events:
        yield events


def _events(logged: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logged if e["event"] == name]


def test_a_plain_answer_is_one_line_with_its_episode(
    start_server: ServerFactory, logged: list[MutableMapping[str, Any]], tmp_path: Path
) -> None:
    server = start_server(trajectory_log=str(tmp_path / "t.jsonl"))
    for _ in range(3):
        response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": USER}, timeout=30)
        assert response.status_code == 200, response.text
    records = list(read_trajectories(tmp_path / "t.jsonl"))
    served = _events(logged, "request_served")
    assert len(served) == 3 and _events(logged, "episode_finished") == []
    for line, record in zip(served, records, strict=True):
        assert line["mode"] == "agent" and line["stream"] is False and line["engine"] == "scripted"
        assert line["episode_id"] == record.episode_id and line["stop_reason"] == record.stop_reason
        assert line["turns"] == record.turns == 2 and line["reward"] == record.reward
        assert line["duration_ms"] >= 0


def test_a_streamed_answer_keeps_the_runtime_s_episode_line(
    start_server: ServerFactory, logged: list[MutableMapping[str, Any]]
) -> None:
    server = start_server()
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200 and response.read().endswith(b"data: [DONE]\n\n")
    (episode,) = _events(logged, "episode_finished")
    assert episode["stop_reason"] == "final_answer" and episode["turns"] == 2
    (served,) = _events(logged, "request_served")
    assert served["stream"] is True and "episode_id" not in served


def test_a_failed_episode_says_request_failed_with_its_code(
    start_server: ServerFactory, tokenizer: HFTokenizer, logged: list[MutableMapping[str, Any]]
) -> None:
    server = start_server(engine=ScriptedEngine(tokenizer, [EngineError("connection refused")]))
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": USER}, timeout=30)
    assert response.status_code == 500
    (failed,) = _events(logged, "request_failed")
    assert failed["mode"] == "agent" and failed["code"] == "engine_error" and failed["log_level"] == "warning"
    assert "connection refused" in failed["error"] and failed["episode_id"]
    assert _events(logged, "request_served") == [] and _events(logged, "episode_finished") == []
