"""Agent mode for a program recipe (issue 40): the real app (`create_app(episodes=ProgramEpisodes())`) on uvicorn on
a loopback port, a `ScriptedEngine` that answers each prompt with real Qwen3 ids (`calculator_policy`), and the
calculator agent of ``examples/any_agent`` as the program: in process (`agent.py`) and as a process of its own
(``subprocess_agent.py``, through the app's gateway).

A request runs the program once: its answer is the completion's, with the `agent` summary; streamed, its turns
arrive as agent events while it runs (the program waits for the test to see its first turn before it goes on);
a program that raises or overruns its time ends the request with a 500 of its code; a client that leaves
mid-stream has a command program's whole process group killed; the trajectory log gets each finished episode."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import ScriptedEngine, read_trajectories
from agent_runtime.agent_program import AgentProgram, ProgramTask
from agent_runtime.proxy import ProgramEpisodes
from agent_runtime.serving import ServeConfig, create_app
from examples.any_agent.agent import CALCULATOR_TOOL, calculate, calculator_agent
from examples.any_agent.recipe import SUBPROCESS_AGENT
from tests.serve.conftest import MODEL, LiveServer
from tests.support.calculator_policy import calculator_policy
from tests.support.calculator_recipe import calculator_recipe

QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]

ANSWERS: list[str | None] = []  # what the in-process program returned, in order
GATE = threading.Event()  # the gated program's second turn waits for it


async def recorded_agent(client: Any, task: ProgramTask) -> str | None:
    answer = await calculator_agent(client, task)
    ANSWERS.append(answer)
    return answer


async def gated_agent(client: Any, task: ProgramTask) -> str | None:
    """The calculator loop, held after its first turn until the test has seen that turn's events."""
    messages = task.messages
    first = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR_TOOL])
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    if not await asyncio.to_thread(GATE.wait, 30):
        raise RuntimeError("the test never saw the first turn's events")
    second = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR_TOOL])
    return str(second.choices[0].message.content)


async def raising_agent(client: Any, task: ProgramTask) -> str:
    raise ValueError("the program broke on purpose")


async def sleeping_agent(client: Any, task: ProgramTask) -> str:
    await asyncio.sleep(60)
    return "too late"


async def silent_agent(client: Any, task: ProgramTask) -> str:
    return "answered without the model"


HANGING_SCRIPT = """
import json, os, subprocess, sys, time
import openai
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
task = json.loads(sys.stdin.read())
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=task["prompt"], tools=[TOOL])
time.sleep(600)
"""


@pytest.fixture
def serve(tokenizer: HFTokenizer, tmp_path: Path) -> Iterator[Any]:
    servers: list[LiveServer] = []

    def start(program: AgentProgram, episodes: ProgramEpisodes | None = None) -> LiveServer:
        engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25)
        log = tmp_path / f"trajectories-{len(servers)}.jsonl"
        config = ServeConfig(model_name=MODEL, trajectory_log=str(log))
        app = create_app(engine, calculator_recipe(agent=program), config, episodes=episodes or ProgramEpisodes())
        server = LiveServer(app)
        server.trajectory_log = log
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def post(server: LiveServer, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, **body}, timeout=300
    )


def records(server: LiveServer) -> list[Any]:
    assert server.trajectory_log is not None
    return list(read_trajectories(server.trajectory_log)) if server.trajectory_log.exists() else []


def agent_events(lines: list[str]) -> list[dict[str, Any]]:
    return [e["agent_event"] for e in frames(lines) if e.get("agent_event")]


def frames(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_a_request_runs_the_program_and_answers_with_its_answer(serve: Any) -> None:
    server = serve(AgentProgram(recorded_agent, timeout_s=30))
    ANSWERS.clear()
    response = post(server)
    assert response.status_code == 200, response.text
    completion = response.json()
    assert ANSWERS == ["The answer is 391."]
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"] == ANSWERS[0]
    assert completion["choices"][0]["finish_reason"] == "stop"
    agent = completion["agent"]
    assert (agent["turns"], agent["tool_calls"], agent["stop_reason"]) == (2, 1, "final_answer")
    (record,) = records(server)  # the episode in the server's trajectory log, as agent mode's
    assert record.episode_id == agent["episode_id"] and record.reward == agent["reward"]
    assert record.final_answer == ANSWERS[0] and record.task["agent_program"]["requests"] == 2
    assert [m.content for m in record.messages if m.role == "tool"] == ["391"]  # the program's own tool ran
    (segment,) = record.segments
    usage = completion["usage"]
    assert (usage["completion_tokens"], usage["total_tokens"]) == (sum(segment.loss_mask), len(segment.ids))
    health = httpx.get(f"{server.url}/health", timeout=10).json()
    assert health["agent"] == "program"
    metrics = server.metrics()
    assert metrics["episodes"] == 1 and metrics["tool_calls"] == 1


def test_the_stream_reports_each_turn_while_the_program_runs(serve: Any) -> None:
    server = serve(AgentProgram(gated_agent, timeout_s=60))
    GATE.clear()
    lines: list[str] = []
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "stream": True},
        timeout=300,
    ) as response:  # fmt: skip
        assert response.status_code == 200
        for line in filter(None, response.iter_lines()):
            lines.append(line)
            if not GATE.is_set() and agent_events(lines):  # the first turn is here; the program still waits
                seen = agent_events(lines)
                assert all(e["type"] != "final" for e in seen) and seen[0]["type"] == "assistant"
                GATE.set()
    assert GATE.is_set() and lines[-1] == "data: [DONE]"
    events = agent_events(lines)
    assert [(e["type"], e.get("turn")) for e in events] == [
        ("assistant", 1), ("tool_call", 1), ("tool_result", 1), ("assistant", 2), ("final", None),
    ]  # fmt: skip
    call, result, final = events[1]["call"], events[2], events[4]
    assert call["name"] == "calculator" and call["arguments"] == {"expression": "17 * 23"}
    assert (result["tool_call_id"], result["name"], result["content"]) == (call["id"], "calculator", "391")
    assert events[0]["tokens"] > 0 and events[3]["content"] == "The answer is 391."
    assert final["answer"] == "The answer is 391." and final["stop_reason"] == "final_answer"
    content = [c["choices"][0]["delta"].get("content") for c in frames(lines) if c.get("choices")]
    assert "The answer is 391." in content
    (record,) = records(server)
    assert record.final_answer == "The answer is 391." and final["reward"] == record.reward


def test_a_command_program_is_served_through_the_apps_gateway(serve: Any) -> None:
    episodes = ProgramEpisodes()
    program = AgentProgram.command([sys.executable, str(SUBPROCESS_AGENT)], timeout_s=240)  # a loaded host's start
    server = serve(program, episodes)
    for _ in range(2):  # two requests, one gateway
        response = post(server)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "The answer is 391."
    gateway = episodes.gateways.gateway
    assert gateway is not None and episodes.gateways.started == 1
    assert [len(r.task["agent_program"]["breaks"]) for r in records(server)] == [0, 0]
    url = gateway.url
    server.stop()  # the app's shutdown stops the gateway: nothing listens there any more
    assert episodes.gateways.gateway is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=5)


def test_a_program_that_raises_is_a_500_with_its_code(serve: Any) -> None:
    server = serve(AgentProgram(raising_agent, timeout_s=30))
    response = post(server)
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "program_error" and "the program broke on purpose" in error["message"]
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "stream": True},
        timeout=300,
    ) as streamed:  # fmt: skip
        lines = list(filter(None, streamed.iter_lines()))
    assert [e["type"] for e in agent_events(lines)] == ["error", "final"]
    assert frames(lines)[-1]["error"]["code"] == "program_error" and lines[-1] == "data: [DONE]"
    assert [r.task["agent_program"]["code"] for r in records(server)] == ["program_error"] * 2
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # the server goes on


def test_a_program_past_its_time_is_a_500_program_timeout(serve: Any) -> None:
    server = serve(AgentProgram(sleeping_agent, timeout_s=0.5))
    response = post(server)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "program_timeout"


def test_an_answer_without_model_calls_is_an_answer(serve: Any) -> None:
    server = serve(AgentProgram(silent_agent, timeout_s=30))
    response = post(server)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "answered without the model"
    assert records(server)[0].task["agent_program"]["code"] == "no_model_calls"


def test_a_client_leaving_mid_stream_kills_the_command_programs_group(serve: Any, tmp_path: Path) -> None:
    script = tmp_path / "hanging_agent.py"
    script.write_text(HANGING_SCRIPT.replace("TOOL", repr(CALCULATOR_TOOL)))
    pids_file = tmp_path / "pids"
    program = AgentProgram.command([sys.executable, str(script), str(pids_file)], timeout_s=240, kill_grace_s=0.5)
    server = serve(program)
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, "stream": True},
        timeout=300,
    ) as response:  # fmt: skip
        lines: list[str] = []
        for line in filter(None, response.iter_lines()):
            lines.append(line)
            if agent_events(lines):  # the program's first turn: it made its call and now hangs
                pids = [int(p) for p in pids_file.read_text().split()]  # written before its call
                assert len(pids) == 2 and all(alive(pid) for pid in pids)
                break  # leaving the loop closes the stream: the client hangs up
    # the client has hung up (the stream closed unread): the program, and the child it started, are killed
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)
    assert not any(e["type"] == "final" for e in agent_events(lines))
    for _ in range(100):  # the request's slot is given back
        if server.metrics()["in_flight"] == 0:
            break
        time.sleep(0.05)
    assert server.metrics()["in_flight"] == 0
