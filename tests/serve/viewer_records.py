"""Trajectory files for the viewer's tests, made the way users make them: the real server's `--trajectory-log`
(calculator episodes on the real Qwen3 tokenizer through the real session, one that fails, a vision episode with
an attached image and one whose tool returned images) and a compacted episode run by `AgentRuntime` with
`CompactionPolicy`, written by `TrajectoryWriter`."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, ScriptedEngine, Trajectory, TrajectoryWriter
from agent_runtime import read_trajectories as read_records
from tests.agent_protocol.families.test_qwen3_vl import png
from tests.agent_runtime.test_compaction import SUMMARY
from tests.agent_runtime.test_compaction import make as compacting_session
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.serve.conftest import MODEL, LiveServer, ServerFactory, calculator_question
from tests.serve.test_serve_images import GRID, vision_policy, vision_recipe


def read_trajectories(path: Path) -> list[Trajectory]:
    return list(read_records(path))


def _wait_for(log: Path, count: int) -> None:
    """The server writes an episode's record just after answering: wait for `count` lines."""
    for _ in range(500):
        if log.exists() and log.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.01)
    raise RuntimeError(f"{log}: fewer than {count} records")


def _chat(server: LiveServer, messages: list[dict[str, object]], model: str = MODEL) -> int:
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": model, "messages": messages}, timeout=60)
    return response.status_code


def calculator_log(start_server: ServerFactory, log: Path, questions: int = 3) -> Path:
    """`questions` calculator episodes and one that fails (the engine raises after the tool call)."""
    server = start_server(trajectory_log=str(log))
    for i in range(questions):
        assert _chat(server, [{"role": "user", "content": calculator_question(i)[0]}]) == 200
    assert _chat(server, [{"role": "user", "content": "What is 6 * 7? Then explode."}]) == 500
    _wait_for(log, questions + 1)
    return log


def vision_log(start_server: ServerFactory, tokenizer: HFTokenizer, log: Path, folder: Path) -> Path:
    """A question with an attached 300x200 PNG, and one asking the zoom tool (which returns images)."""
    vision = HFTokenizer(tokenizer.backend, source=tokenizer.source, vision=GRID)
    engine = ScriptedEngine(vision, policy=vision_policy(vision))
    server = start_server(engine=engine, recipe=vision_recipe(folder), trajectory_log=str(log))
    url = "data:image/png;base64," + base64.b64encode(png(300, 200)).decode()
    content = [{"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": url}}]
    assert _chat(server, [{"role": "user", "content": content}]) == 200
    zoom = [{"type": "text", "text": "Zoom in, please."}, {"type": "image_url", "image_url": {"url": url}}]
    assert _chat(server, [{"role": "user", "content": zoom}]) == 200
    _wait_for(log, 2)
    return log


def compacted_log(tokenizer: HFTokenizer, log: Path) -> Path:
    """One episode compacted once (`tests/agent_runtime/test_compaction.py`'s): the tool turn, the summary turn, a new
    segment from the summary, the answer."""
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), f"{SUMMARY}<|im_end|>", answer("391")], logprob=-0.5)
    episode = AgentRuntime(engine, compacting_session(tokenizer)).run(QUESTION, task={"answer": "391"})
    with ThreadPoolExecutor(1) as thread:  # in its own thread: Playwright's sync API holds this one's event loop
        result = thread.submit(asyncio.run, episode).result()
    if result.trajectory.compactions != 1:
        raise RuntimeError(f"expected one compaction, got {result.trajectory.compactions}")
    TrajectoryWriter(log).write(result.trajectory)
    return log


def copies(source: Path, target: Path, times: int, *, malformed_every: int = 0) -> Path:
    """`source`'s records `times` over (a file larger than a page), a malformed line every `malformed_every`."""
    lines = [line for line in source.read_bytes().splitlines() if line.strip()]
    with open(target, "wb") as out:
        for n in range(times):
            for line in lines:
                out.write(line + b"\n")
            if malformed_every and n % malformed_every == 0:
                out.write(b'{"episode_id": "broken", "segments": [1, 2\n' if n % 2 else b"not json at all\n")
    return target


def step_file(source: Path, target: Path, step: int) -> Path:
    """`source`'s records as a checkpoint `step` would log them (the task names its step)."""
    with open(target, "wb") as out:
        for line in source.read_bytes().splitlines():
            record = json.loads(line)
            record["task"] = {**record.get("task", {}), "step": step}
            out.write(json.dumps(record).encode() + b"\n")
    return target


def masked_file(source: Path, target: Path) -> Path:
    """`source`'s first record with its first action's loss mask zeroed and its logprobs kept: a sampled turn the
    trainer leaves out (as an overlong or masked turn is), so colour by loss mask and colour by logprob differ."""
    record = json.loads(source.read_bytes().splitlines()[0])
    segment = record["segments"][0]
    action = next(span for span in segment["spans"] if span["kind"] == "action")
    segment["loss_mask"][action["start"] : action["end"]] = [0] * (action["end"] - action["start"])
    target.write_bytes(json.dumps(record).encode() + b"\n")
    return target
