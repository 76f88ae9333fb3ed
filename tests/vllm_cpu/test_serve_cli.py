"""`apps/serve --engine vllm` as a user starts it (a subprocess), on vLLM's CPU build, over HTTP with the official
openai client: agent mode, streamed, and tools mode answer, and every turn the server generated (read back from
its `--trajectory-log`) is exactly what `HFEngine` generates greedily from the same prompt ids.

The command line has no vLLM CPU flags, so the CPU settings go in vLLM's own environment variables, as a user
on a CPU would set them: `VLLM_CPU_KVCACHE_SPACE=1` (GiB of KV cache; without it the CPU backend reserves
`gpu_memory_utilization`, 0.9, of the machine's RAM and fails to start) and `VLLM_ENABLE_V1_MULTIPROCESSING=0`
(vLLM's engine core in one child process instead of two). This starts a second vLLM, about two minutes here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_runtime import SamplingParams, read_trajectories
from tests.support.calculator_policy import CALCULATOR_TOOL
from tests.support.serve_process import ServeProcess, free_port
from tests.vllm_cpu.conftest import CONTEXT, LoopThread

CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}


def test_apps_serve_with_the_vllm_engine_over_http(
    loop: LoopThread, model_dir: Path, hf_engine: Any, tmp_path: Path
) -> None:
    from openai import OpenAI

    log = tmp_path / "trajectories.jsonl"
    args = ["--engine", "vllm", "--model", str(model_dir), "--port", str(free_port())]
    args += ["--context-length", str(CONTEXT), "--trajectory-log", str(log)]
    with ServeProcess(args, env=CPU_ENV, start_timeout=900) as app:
        client = OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        request: dict[str, Any] = {
            "model": model, "messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0.0,
            "max_tokens": 12,
        }  # fmt: skip
        agent = client.chat.completions.create(**request)
        chunks = list(client.chat.completions.create(**request, stream=True))
        tools = client.chat.completions.create(**request, tools=[CALCULATOR_TOOL])
    assert app.returncode == 0, app.stderr[-3000:]
    assert agent.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == agent.choices[0].message.content
    assert tools.choices[0].finish_reason in {"stop", "length", "tool_calls"}

    records = list(read_trajectories(log))
    assert len(records) == 3
    turns = 0
    for record in records:
        for segment in record.segments:
            for start, end in segment.action_ranges:
                prompt = segment.ids[:start]
                again = loop.run(
                    hf_engine.generate(prompt, SamplingParams(max_new_tokens=end - start, temperature=0.0))
                )
                assert segment.ids[start:end] == again.ids
                turns += 1
    assert turns >= 3
