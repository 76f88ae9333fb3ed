"""Issue 40's Done-when, "32 concurrent sessions with one hostile program leave the other 31 episodes' records
intact": one listening `Gateway`, one `ScriptedEngine` replaying real Qwen3 ids (the calculator policy, so every
episode gets the answer to its own question), 32 episodes at once through `run_program`: 31 runs of the subprocess
agent (``examples/any_agent/subprocess_agent.py``: a separate Python with the synchronous `openai` client and only
its environment) and one hostile command of each kind: it hangs (deaf to SIGTERM, with a child), floods its session
with 300 concurrent requests past its `max_requests`, sends wrong keys (its own mangled, and another live session's
key on its URL and its own on the other's), or SIGKILLs itself while a streamed completion is in flight.

Each case checks that the 31 records equal those of the same 31 episodes run with no hostile neighbour (ids, loss
masks, logprobs, action ranges, rewards, answers), that the hostile episode ends with its code, that nothing the
episodes started is left running (the hostile program's process group included), and that the gateway still
answers ``/health``.

Why 31 processes and not 31 function programs: a function program is handed an in-process client and never
touches the gateway, so it would not share the listening server with the hostile one; every episode here reaches
the gateway over loopback HTTP, as a program in another process does. A Python process importing `openai` costs
about 1 s of CPU, so a case takes ~24 s on 2 loaded cores (load ~3.6), and the module ~2 min with the baseline
run (``uv run pytest tests/agent_runtime/test_gateway_hostile.py --durations=6``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_protocol import HFTokenizer
from agent_runtime import SamplingParams, ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramTask
from agent_runtime.proxy import EpisodeEndpoint, Gateway, GatewaySession, ProgramEpisode, run_program
from examples.any_agent.recipe import SUBPROCESS_AGENT
from tests.agent_runtime.test_proxy_gateway import calculator_recipe
from tests.support.calculator_policy import calculator_policy

SAMPLING = SamplingParams(max_new_tokens=64)
HONEST = AgentProgram.command([sys.executable, str(SUBPROCESS_AGENT)], timeout_s=90)
TASKS = [ProgramTask(prompt=f"What is {a} * {a + 7}?", row={"answer": str(a * (a + 7))}) for a in range(11, 42)]
DELAY_S = 0.3  # each generation takes this long, so that a streamed completion is in flight for a while

# Every hostile program starts by leaving its pid where the test finds it, then reads its task.
PROLOGUE = """
import json, os, signal, subprocess, sys, time
open(os.environ["HOSTILE_PID_FILE"], "w").write(str(os.getpid()))
task = json.load(sys.stdin)
"""

HANGS = """
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the polite stop
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # and a child in its group
time.sleep(120)
"""

FLOODS = """
import collections, concurrent.futures, openai
client = openai.OpenAI(max_retries=0)
messages = [{"role": "user", "content": task["prompt"]}]
def one(_):
    try:
        client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages)
        return "200"
    except openai.APIStatusError as e:
        return str(e.status_code)
    except openai.APIConnectionError:
        return "closed"
with concurrent.futures.ThreadPoolExecutor(64) as pool:
    print(collections.Counter(pool.map(one, range(300))), flush=True)
"""

WRONG_KEYS = """
import urllib.error, urllib.request
own_url, own_key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
while True:  # the roster the test's gateway writes: every session's URL and key
    others = [line.split() for line in open(os.environ["ROSTER"]).read().splitlines() if not line.startswith(own_url)]
    if others:
        break
    time.sleep(0.05)
other_url, other_key = others[0]
body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": task["prompt"]}]})
def status(url, key, route="/chat/completions", data=body):
    request = urllib.request.Request(url + route, data=data.encode(), method="POST",
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request).status
    except urllib.error.HTTPError as e:
        return e.code
statuses = [
    status(own_url, own_key[::-1]), status(own_url, own_key + "x"), status(own_url, own_key[:-1]), status(own_url, ""),
    status(own_url, other_key),  # another live session's key on its own URL
    status(other_url, own_key),  # its own key on the other session's URL
    status(other_url.removesuffix("/v1"), own_key, "/end", '{"answer": "hijacked"}'),
    status(other_url.removesuffix("/v1"), own_key, "/reward", '{"reward": -100}'),
]
print(other_url.split("/sessions/")[1].split("/")[0], time.monotonic(), *statuses)  # (the clock is the system's)
"""

CRASHES = """
import openai
client = openai.OpenAI(max_retries=0)
messages = [{"role": "user", "content": task["prompt"]}]
stream = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, stream=True)
for chunk in stream:  # the first event is in: the completion is being generated
    os.kill(os.getpid(), signal.SIGKILL)
"""

HOSTILE = {"hangs": HANGS, "floods": FLOODS, "wrong_key": WRONG_KEYS, "crashes": CRASHES}


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


class RosterGateway(Gateway):
    """A gateway that writes each session it opens (its base URL and key) to `roster`, for the wrong-key program
    to steal, and keeps the sessions for the test's checks."""

    def __init__(self, roster: Path) -> None:
        super().__init__()
        self.roster = roster
        self.opened: list[GatewaySession] = []
        self.closed_at: dict[str, float] = {}

    def open(self, endpoint: EpisodeEndpoint) -> GatewaySession:
        session = super().open(endpoint)
        self.opened.append(session)
        with self.roster.open("a") as roster:
            roster.write(f"{session.base_url} {session.key}\n")
        return session

    def close(self, session: GatewaySession) -> None:
        self.closed_at.setdefault(session.id, time.monotonic())
        super().close(session)


def record(episode: ProgramEpisode) -> tuple[Any, ...]:
    """What training takes of an episode."""
    t = episode.trajectory
    return (
        episode.outcome.code, episode.outcome.requests, t.final_answer, t.reward,
        [s.ids for s in t.segments], [s.loss_mask for s in t.segments], [s.logprobs for s in t.segments],
        [s.action_ranges for s in t.segments],
    )  # fmt: skip


async def episodes(
    tokenizer: HFTokenizer, gateway: Gateway, hostile: AgentProgram | None
) -> tuple[dict[str, ProgramEpisode], ProgramEpisode | None]:
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), logprob=-0.25, delay_s=DELAY_S)
    honest = calculator_recipe(HONEST)
    runs = [run_program(honest, engine, task, sampling=SAMPLING, gateway=gateway) for task in TASKS]
    if hostile is not None:
        bad = ProgramTask(prompt="What is 6 * 7?", row={"answer": "42"})
        runs.append(run_program(calculator_recipe(hostile), engine, bad, sampling=SAMPLING, gateway=gateway))
    ran = await asyncio.gather(*runs)
    return {str(task.prompt): e for task, e in zip(TASKS, ran, strict=False)}, (ran[-1] if hostile else None)


@pytest.fixture(scope="module")
def alone(tokenizer: HFTokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, ...]]:
    """The 31 episodes' records with no hostile neighbour."""

    async def main() -> dict[str, ProgramEpisode]:
        async with RosterGateway(tmp_path_factory.mktemp("alone") / "roster") as gateway:
            return (await episodes(tokenizer, gateway, None))[0]

    ran = asyncio.run(main())
    assert all(e.outcome.code is None and e.outcome.requests == 2 for e in ran.values()), ran
    assert all(e.trajectory.final_answer == f"The answer is {t.row['answer']}." for t in TASKS
               for e in [ran[str(t.prompt)]])  # fmt: skip
    return {prompt: record(e) for prompt, e in ran.items()}


def group_alive(pgid: int) -> list[int]:
    """The processes of group `pgid` that are not zombies (this container's init does not reap orphans)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(stat.parent.name))
    return alive


def children_alive() -> list[int]:
    """This process's children that are still running."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            alive.append(int(stat.parent.name))
    return alive


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_one_hostile_program_leaves_the_other_31_records_intact(
    tokenizer: HFTokenizer, alone: dict[str, tuple[Any, ...]], kind: str, tmp_path: Path
) -> None:
    pid_file, roster = tmp_path / "pid", tmp_path / "roster"
    env = {**os.environ, "HOSTILE_PID_FILE": str(pid_file), "ROSTER": str(roster)}
    code = textwrap.dedent(PROLOGUE) + textwrap.dedent(HOSTILE[kind])
    hostile = AgentProgram.command(
        [sys.executable, "-c", code], env=env, timeout_s=6.0 if kind == "hangs" else 90, kill_grace_s=0.3,
        max_requests=8,
    )  # fmt: skip

    async def main() -> tuple[dict[str, ProgramEpisode], ProgramEpisode | None, RosterGateway, int]:
        async with RosterGateway(roster) as gateway, httpx.AsyncClient(timeout=10) as http:
            ran, bad = await episodes(tokenizer, gateway, hostile)
            health = await http.get(f"{gateway.url}/health")
            assert health.status_code == 200 and health.json() == {"status": "ok", "sessions": 0}
            return ran, bad, gateway, gateway.sessions

    ran, bad, gateway, left_open = asyncio.run(main())
    assert bad is not None and left_open == 0
    assert {prompt: record(e) for prompt, e in ran.items()} == alone  # the 31 records, id for id

    outcome = bad.outcome
    if kind == "hangs":
        assert (outcome.code, outcome.requests) == ("program_timeout", 0), outcome
    elif kind == "floods":
        assert (outcome.code, outcome.requests) == ("too_many_requests", 8), outcome
    elif kind == "wrong_key":
        assert (outcome.code, outcome.requests) == ("no_model_calls", 0), outcome
        victim_id, done_at, *statuses = str(bad.trajectory.final_answer).split()
        assert statuses == ["401"] * 8, statuses
        (victim,) = [s for s in gateway.opened if s.id == victim_id]
        assert gateway.closed_at[victim_id] > float(done_at)  # the victim was live while its key was tried
        assert victim.endpoint.requests == 2 and victim.reward is None  # its own two turns, nothing of the thief's
        assert victim.finished.cancelled() or victim.finished.result() != "hijacked"
    else:
        assert outcome.code == "program_error" and "killed by signal 9" in outcome.message, outcome
        assert outcome.requests == 1

    pgid = int(pid_file.read_text())  # the hostile program's process group: its pid (start_new_session)
    assert group_alive(pgid) == [] and children_alive() == []
