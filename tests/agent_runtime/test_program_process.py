"""Command programs (`AgentProgram.command`): a real process per episode, reaching its episode through a real
gateway on loopback, on a `ScriptedEngine` replaying real Qwen3 ids. Every way a command can go wrong ends its own
episode with a code and loses what the model generated before: a non-zero exit (its stderr's tail in the
message), a hang past its time (its whole process group killed, children included, even one that ignores
SIGTERM), no model call, a flood of stdout, a command that does not exist, a cap of the endpoint. And what it may
do right: read its task on stdin, end its session with an answer, post its own reward for the recipe's rewards."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from agent_env import EpisodeRecord, MatchingReward, ResultRewardStrategy, RewardPipeline
from agent_protocol import HFTokenizer
from agent_runtime import Recipe, SamplingParams, ScriptedEngine
from agent_runtime.agent_program import AgentProgram, ProgramCommand, ProgramTask
from agent_runtime.proxy import Gateway, ProgramEpisode, run_program
from examples.any_agent.recipe import SUBPROCESS_AGENT
from tests.agent_runtime.test_session import QUESTION, answer, call

SCRIPT = [call("17 * 23"), answer("The answer is 391.")]


class ReportedReward(ResultRewardStrategy):
    """The score the program posted to its session's /reward, as the recipe's rewards see it."""

    name = "reported"

    async def score(self, episode: EpisodeRecord) -> float:
        return float(episode.metadata.get("program_reward", 0.0))


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


def python(code: str, **options: Any) -> AgentProgram:
    """A command program running `code` in a fresh Python."""
    return AgentProgram.command([sys.executable, "-c", textwrap.dedent(code)], **options)


def run(tokenizer: HFTokenizer, program: AgentProgram, *, row: dict[str, Any] | None = None) -> ProgramEpisode:
    recipe = Recipe(
        name="calc", protocol="qwen3", max_new_tokens=64, agent=program,
        rewards=RewardPipeline(result=[MatchingReward(), ReportedReward()]),
    )  # fmt: skip
    task = ProgramTask(prompt=QUESTION, row=row or {"answer": "391"})
    engine = ScriptedEngine(tokenizer, SCRIPT, logprob=-0.25)
    return asyncio.run(run_program(recipe, engine, task, sampling=SamplingParams(max_new_tokens=64)))


# One model call with the synchronous client, from the environment alone; the tool call's text is printed.
ONE_CALL = """
import json, os, sys, openai
task = json.load(sys.stdin)
client = openai.OpenAI(max_retries=0)
messages = [{"role": "user", "content": task["prompt"]}]
reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages)
print(reply.choices[0].message.content or "no content", flush=True)
"""

# Then its reward and its answer, posted to its session; then it would sleep: it is stopped, not waited for.
END_AND_REWARD = """
import time, urllib.request
def post(route, body):
    url = os.environ["OPENAI_BASE_URL"].removesuffix("/v1") + route
    headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
    urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)).read()
post("/reward", {"reward": 0.75})
post("/end", {"answer": "The answer is " + task["row"]["answer"] + "."})
time.sleep(120)
"""


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for a parent that does not reap (this container's init)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


# -- failures ----------------------------------------------------------------------------------------------------


def test_a_non_zero_exit_is_a_program_error_with_its_stderrs_tail(tokenizer: HFTokenizer) -> None:
    code = ONE_CALL + 'sys.stderr.write("noise " * 2000 + "Traceback: the tool broke")\nsys.exit(3)\n'
    ran = run(tokenizer, python(code, timeout_s=30))
    assert ran.outcome.code == "program_error" and ran.outcome.requests == 1
    assert "exited with status 3" in ran.outcome.message and ran.outcome.message.endswith("the tool broke'")
    assert len(ran.outcome.message) < 700  # the tail only
    (segment,) = ran.trajectory.segments  # the turn before the failure is kept
    assert 1 in segment.loss_mask and ran.trajectory.task["agent_program"]["code"] == "program_error"


def test_a_hang_past_the_timeout_kills_the_whole_process_group(tokenizer: HFTokenizer, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the polite stop: SIGKILL must follow
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """
    started = time.monotonic()
    ran = run(tokenizer, python(code, timeout_s=2.0, kill_grace_s=0.3))
    took = time.monotonic() - started
    assert ran.outcome.code == "program_timeout" and "2.0 s" in ran.outcome.message
    assert took < 10, took
    leader, child = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 5
    while not (gone(leader) and gone(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(leader) and gone(child)
    assert ran.trajectory.reward == 0.0 and ran.outcome.requests == 0


def test_a_child_left_behind_neither_holds_the_episode_nor_survives_it(tokenizer: HFTokenizer, tmp_path: Path) -> None:
    pid = tmp_path / "pid"
    code = ONE_CALL + textwrap.dedent(f"""
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # holds stdout and stderr
        open({str(pid)!r}, "w").write(str(child.pid))
        print("The answer is 391.")
    """)
    started = time.monotonic()
    ran = run(tokenizer, python(code, timeout_s=60))
    assert time.monotonic() - started < 15  # the program's exit ends it, not the child's pipes
    assert ran.outcome.code is None and ran.trajectory.final_answer == "The answer is 391."
    deadline = time.monotonic() + 5
    while not gone(int(pid.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(int(pid.read_text()))


def test_a_program_that_never_calls_the_model_gets_no_reward(tokenizer: HFTokenizer) -> None:
    ran = run(tokenizer, python('print("The answer is 391.")', timeout_s=30))
    assert ran.outcome.code == "no_model_calls" and ran.trajectory.reward == 0.0
    assert ran.trajectory.final_answer == "The answer is 391."  # kept, not rewarded


def test_a_flood_of_stdout_is_cut_off(tokenizer: HFTokenizer) -> None:
    code = 'import sys, time\nsys.stdout.write("x" * 5_000_000)\nsys.stdout.flush()\ntime.sleep(120)\n'
    started = time.monotonic()
    ran = run(tokenizer, python(code, timeout_s=60, max_output_bytes=1 << 16, kill_grace_s=0.3))
    assert ran.outcome.code == "program_error" and "more than 65536 bytes to its stdout" in ran.outcome.message
    assert time.monotonic() - started < 15  # stopped at once, not at its timeout


def test_a_command_that_cannot_start_is_a_program_error(tokenizer: HFTokenizer, tmp_path: Path) -> None:
    ran = run(tokenizer, AgentProgram.command([str(tmp_path / "no-such-agent")], timeout_s=30))
    assert ran.outcome.code == "program_error" and "could not be started" in ran.outcome.message
    with pytest.raises(ValueError, match="non-empty"):
        ProgramCommand(())


def test_the_endpoints_cap_ends_a_command_program(tokenizer: HFTokenizer) -> None:
    program = AgentProgram.command([sys.executable, str(SUBPROCESS_AGENT)], timeout_s=30, max_requests=1)
    ran = run(tokenizer, program)
    assert ran.outcome.code == "too_many_requests" and ran.outcome.requests == 1
    assert len(ran.trajectory.segments) == 1 and 1 in ran.trajectory.segments[0].loss_mask  # the first turn kept


# -- what a command may do ----------------------------------------------------------------------------------------


def test_a_command_reads_its_task_ends_its_session_and_posts_its_reward(tokenizer: HFTokenizer) -> None:
    code = ONE_CALL + END_AND_REWARD
    started = time.monotonic()
    ran = run(tokenizer, python(code, timeout_s=60, kill_grace_s=0.3))
    assert time.monotonic() - started < 15
    assert ran.outcome.code is None and ran.outcome.reported_reward == 0.75
    assert ran.trajectory.final_answer == "The answer is 391."
    assert ran.trajectory.breakdown is not None
    assert ran.trajectory.breakdown.result["reported"] == 0.75
    assert ran.trajectory.reward == pytest.approx(1.75)  # matching 1 + the reported 0.75
    assert ran.trajectory.task["agent_program"]["reported_reward"] == 0.75


def test_the_last_non_empty_line_of_stdout_is_the_answer(tokenizer: HFTokenizer) -> None:
    code = ONE_CALL + 'print("thinking...")\nprint("  The answer is 391.  ")\nprint()\nprint("   ")\n'
    ran = run(tokenizer, python(code, timeout_s=30, env={**os.environ, "EXTRA": "1"}))
    assert ran.outcome.code is None and ran.trajectory.final_answer == "The answer is 391."


def test_a_gateway_is_per_worker_and_left_running(tokenizer: HFTokenizer) -> None:
    async def main() -> tuple[int, str]:
        async with Gateway() as gateway:
            recipe = Recipe(name="calc", protocol="qwen3", max_new_tokens=64, agent=python(ONE_CALL, timeout_s=30))
            engine = ScriptedEngine(tokenizer, SCRIPT)
            task = ProgramTask(prompt=QUESTION)
            ran = await run_program(recipe, engine, task, sampling=SamplingParams(max_new_tokens=64), gateway=gateway)
            return gateway.sessions, str(ran.outcome.code)

    assert asyncio.run(main()) == (0, "None")


def test_a_conversation_past_the_cap_is_refused_through_the_gateway(tokenizer: HFTokenizer) -> None:
    code = ONE_CALL + textwrap.dedent("""
        other = [{"role": "user", "content": "2+2?"}]  # a second conversation
        try:
            client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=other)
        except openai.APIStatusError as e:
            print(e.status_code, e.code, file=sys.stderr)
            sys.exit(4)
        print("the second conversation was answered")
    """)
    ran = run(tokenizer, python(code, timeout_s=30, max_conversations=1))
    assert ran.outcome.code == "too_many_conversations" and ran.outcome.requests == 2
    assert len(ran.trajectory.segments) == 1  # the first conversation kept, the second's turn dropped
