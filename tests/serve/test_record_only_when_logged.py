"""An agent-mode request builds its episode's trajectory record only when the server has a trajectory log to write
it to (apps/serve's default has none), as a tools-mode turn does: the record is the one part of a request that
copies its whole history, and building it for nobody was about 4% of a request's server CPU
(bench/bench_serve_parts.py). With a log, every episode is still recorded. (A disconnected episode's record is
checked by tests/serve/test_disconnects.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_runtime import AgentSession, read_trajectories
from tests.serve.conftest import MODEL, ServerFactory

USER = [{"role": "user", "content": "What is 2 * 21?"}]


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The episode ids of the records the sessions built."""
    ids: list[str] = []
    record = AgentSession.record

    def counted(self: AgentSession, **kwargs: Any) -> Any:
        ids.append(self.episode_id)
        return record(self, **kwargs)

    monkeypatch.setattr(AgentSession, "record", counted)
    return ids


def _ask(url: str) -> httpx.Response:
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER}, timeout=30)
    assert response.status_code == 200, response.text
    return response


def test_no_log_no_record(start_server: ServerFactory, built: list[str]) -> None:
    server = start_server()
    for _ in range(3):
        assert _ask(server.url).json()["agent"]["stop_reason"] == "final_answer"
    assert built == []


def test_with_a_log_every_episode_is_recorded(start_server: ServerFactory, built: list[str], tmp_path: Path) -> None:
    server = start_server(trajectory_log=str(tmp_path / "t.jsonl"))
    answered = [_ask(server.url).json()["agent"]["episode_id"] for _ in range(3)]
    records = list(read_trajectories(tmp_path / "t.jsonl"))
    assert [r.episode_id for r in records] == answered == built
    assert all(r.stop_reason == "final_answer" and r.turns == 2 for r in records)
