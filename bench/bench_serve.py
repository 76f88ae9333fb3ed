"""Requests per second and added latency of the agent server, against a bare endpoint, side by side in one run.

Two servers run as separate processes under the same uvicorn settings, each on its own port:

  (a) bare: a Starlette app whose POST /v1/chat/completions reads the body and returns a canned chat.completion
      (the floor: HTTP, the framework, JSON in and out, nothing else);
  (b) agent: `agent_runtime.serving.create_app` serving the calculator recipe on a `ScriptedEngine` whose policy
      answers from the prompt (real Qwen3 token ids, the real calculator tool), configured as `apps/serve` is by
      default: logging by its own `configure_logging` (JSON lines at info level, rendered by structlog and written
      straight to stderr, which goes into /dev/null), no trajectory log. `--trajectory-log` gives it one (in a
      scratch folder), as `apps/serve --trajectory-log` does: every episode's record written, about 0.05 ms a
      request more (`bench/bench_serve_parts.py` measures that part alone).

Three kinds of request go to the agent server: agent mode (a whole episode server-side: render, two generations,
one calculator call, feedback tokenized alone), the same streamed as SSE with agent events,
and one tools-mode turn (render, one generation, parse, store the transcript). The load generator (httpx, asyncio,
keep-alive connections) runs closed-loop: `--concurrency` clients each sending one request after another for
`--seconds`. Rounds alternate bare and agent so both see the same machine; the median round is reported. Every
round starts both servers afresh (and warms each up): one process of the same code runs some 5 % faster or slower
than another for its whole life (where its memory and hash tables fall), so a run whose rounds all share two
processes measures that draw along with the code. Latency is measured at concurrency 1; throughput at
`--concurrency`.

Server CPU per request is the server process's user + system time over the round (/proc/PID/stat) divided by the
requests answered, so the load generator's CPU is not in it. Of the agent server's CPU, part is the stand-in model's
own work (its policy, tokenizing the answer, decoding the ids), which a real deployment does on a GPU or in another
process and which the bare endpoint does not do at all: the `ScriptedEngine` counts it (`/metrics` "engine"
`model_cpu_s`, read before and after each round), and the table shows the total, the model's share, and the server's
own CPU (the total less the model's share), each as a ratio to bare. Issue 43's bar (agent mode at most 4x bare) is
judged on the server's own CPU; the total is shown beside it.

Below the table, the kernel's part of each server's CPU (its system time; the rest is user time). Both servers' CPU
is mostly user time, in the interpreter: the agent server's is its own Python, the bare endpoint's uvicorn's and
Starlette's per-request Python over httptools and uvloop. So how CPython was built (profile-guided and link-time
optimization, as python.org's, Docker's and uv's managed Pythons are; a shared or static libpython) weighs on the
ratio, and the header says how the servers' interpreter was built, as its `sysconfig` tells. `--server-python PATH`
runs both servers under another interpreter (a virtual environment's python with this tree's packages and uvicorn,
uvloop and httptools installed), the load generator and the yardstick staying on this one.

    uv run python bench/bench_serve.py [--seconds 3] [--rounds 3] [--concurrency 16] [--trajectory-log] [--json F]
                                       [--server-python PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "calculator-agent"
QUESTION = "What is 17 * 23?"
CANNED = {
    "object": "chat.completion",
    "id": "chatcmpl-canned",
    "created": 0,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "The answer is 391."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 258, "completion_tokens": 51, "total_tokens": 309},
}
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
REQUESTS: dict[str, dict[str, Any]] = {
    "agent": {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}]},
    "agent_stream": {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "stream": True},
    "tools_turn": {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "tools": [CALCULATOR_TOOL]},
}


# -- the servers (run in child processes) ----------------------------------------------------------------------


def bare_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    body = json.dumps(CANNED).encode()

    async def completions(request: Request) -> Response:
        await request.body()
        return Response(body, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]), Route("/health", health)])


def agent_app(trajectory_log: str | None = None, log_level: str = "info") -> Any:
    """The agent server's app: `trajectory_log` and `log_level` as apps/serve's ``--trajectory-log`` (none by
    default) and ``--log-level``."""
    from agent_protocol import HFTokenizer
    from agent_runtime import ScriptedEngine
    from agent_runtime.serving import ServeConfig, create_app
    from apps.serve.__main__ import configure_logging
    from tests.support.calculator_policy import calculator_policy
    from tests.support.calculator_recipe import calculator_recipe
    from tests.support.qwen3_tokenizer import qwen3_tokenizer_path

    configure_logging("json", log_level)  # as apps/serve logs; the child's stderr is /dev/null
    tokenizer = HFTokenizer.from_file(qwen3_tokenizer_path())
    engine = ScriptedEngine(tokenizer, policy=calculator_policy(tokenizer), record=False)  # keeps no prompts
    config = ServeConfig(model_name=MODEL, max_concurrency=1024, trajectory_log=trajectory_log)
    return create_app(engine, calculator_recipe(), config)


def serve(kind: str, port: int) -> None:
    import uvicorn

    app = bare_app() if kind == "bare" else agent_app(os.environ.get("BENCH_TRAJECTORY_LOG") or None)
    profile_to = os.environ.get("BENCH_PROFILE") if kind == "agent" else None
    if profile_to is None:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)
        return
    import cProfile  # serving only, not the start-up; written when the server stops (SIGTERM: a graceful stop)
    import signal

    # uvicorn re-raises the SIGTERM it stopped on once it has stopped: a no-op handler lets the stats be written
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    with cProfile.Profile(time.process_time) as profile:  # CPU time: waiting on sockets or for a core is not cost
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)
    profile.dump_stats(profile_to)


# -- the load generator --------------------------------------------------------------------------------------


def start(
    kind: str, port: int, env: dict[str, str] | None = None, python: str = sys.executable
) -> subprocess.Popen[bytes]:
    command = [python, __file__, "--serve", kind, "--port", str(port)]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:  # its stderr is /dev/null (the request log's cost): say how to see it
            raise RuntimeError(
                f"the {kind} server exited with code {process.returncode} before it answered; "
                f"`{python} bench/bench_serve.py --serve {kind} --port {port}` shows why"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the {kind} server did not answer /health within 120 s")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The process's user and system CPU time so far (/proc/PID/stat fields 14 and 15, in clock ticks): the
    server's own cost, whatever the load generator spends; the system part is the kernel's work for it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def load(
    url: str, body: dict[str, Any], concurrency: int, seconds: float, server_pid: int | None = None
) -> dict[str, float]:
    """Closed loop: `concurrency` clients, each sending its next request when the last one is answered. With
    `server_pid`, also the server's CPU time per request over the measured span (`server_cpu_ms`), and the part of it
    the stand-in model reports in `/metrics` (`model_cpu_ms`; 0 for the bare endpoint, which has no model)."""
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one() -> None:
            t0 = time.perf_counter()
            response = await client.post("/v1/chat/completions", content=payload, headers=headers)
            response.raise_for_status()
            if body.get("stream") and not response.text.endswith("data: [DONE]\n\n"):
                raise RuntimeError("a stream ended without [DONE]")
            latencies.append(time.perf_counter() - t0)

        for _ in range(3):  # warm the connections and the server
            await one()
        latencies.clear()
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                await one()

        async def model_cpu() -> float:
            """The stand-in model's CPU seconds so far (the agent server's /metrics; the bare endpoint has none)."""
            response = await client.get("/metrics")
            return float(response.json()["engine"]["model_cpu_s"]) if response.status_code == 200 else 0.0

        model_before = await model_cpu()
        user_before, system_before = cpu_seconds(server_pid) if server_pid else (0.0, 0.0)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        user, system = cpu_seconds(server_pid) if server_pid else (0.0, 0.0)
        user, system = user - user_before, system - system_before
        cpu = user + system
        model = await model_cpu() - model_before
    latencies.sort()
    return {
        "server_cpu_ms": cpu / len(latencies) * 1000,
        "system_cpu_ms": system / len(latencies) * 1000,
        "model_cpu_ms": model / len(latencies) * 1000,
        "own_cpu_ms": (cpu - model) / len(latencies) * 1000,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "mean_ms": statistics.fmean(latencies) * 1000,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


def median_round(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


BUILD_PROBE = """
import json, platform, sysconfig
get = sysconfig.get_config_var
configure = get("CONFIG_ARGS") or ""
flags = " ".join(str(get(name) or "") for name in ("PY_CFLAGS", "PY_CFLAGS_NODIST", "PY_LDFLAGS_NODIST"))
print(json.dumps({
    "version": platform.python_version(),
    "pgo": "--enable-optimizations" in configure or "-fprofile-use" in flags,
    "lto": "--with-lto" in configure or "-flto" in flags,
    "shared": any("libpython" in line for line in open("/proc/self/maps")),
}))
"""


def interpreter(python: str) -> str:
    """How `python` was built: its version, profile-guided and link-time optimization as its `sysconfig` records
    them (configure arguments, compiler flags: a distribution that strips them, as Debian does, reads as without),
    and whether the running executable loads libpython as a shared library (its memory map)."""
    found = json.loads(subprocess.run([python, "-c", BUILD_PROBE], capture_output=True, text=True, check=True).stdout)
    optimized = [name.upper() for name in ("pgo", "lto") if found[name]]
    build = " and ".join(optimized) if optimized else "no PGO or LTO"
    linked = "libpython a shared library" if found["shared"] else "libpython linked in"
    return f"CPython {found['version']} ({build} in its sysconfig; {linked})"


def yardstick_us() -> float:
    """The best of five timings of `sum(range(1000))`, in microseconds: how fast this machine runs Python right now.
    On one idle host (load average under 1) the bare endpoint cost 0.14 ms a request at one time and 0.32-0.42 ms
    half an hour later, and the ratios to bare moved with it (the two servers' costs do not scale alike), so a
    figure is comparable only with one taken at about the same yardstick."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


async def warm_up(url: str, kinds: list[str], requests: int = 100) -> None:
    """`requests` of each kind, one at a time, before a fresh server is measured (caches, the piece cache)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for kind in kinds:
            for _ in range(requests):
                (await client.post("/v1/chat/completions", json=REQUESTS[kind])).raise_for_status()


def run(
    seconds: float,
    rounds: int,
    concurrency: int,
    base_port: int,
    scratch: Path,
    profile: Path | None = None,
    trajectory_log: bool = False,
    python: str = sys.executable,
) -> dict[str, Any]:
    """`rounds` rounds, each on a fresh pair of servers (see the module docstring), run by `python`. With
    `profile`, the first round's agent server runs under cProfile and writes its stats there when it stops."""
    # a trajectory log is a real file (the viewer over it refuses /dev/null), in a folder removed after the run
    env = {"BENCH_TRAJECTORY_LOG": str(scratch / "trajectories.jsonl") if trajectory_log else ""}
    urls = {"bare": f"http://127.0.0.1:{base_port}", "agent": f"http://127.0.0.1:{base_port + 1}"}
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the start, a pure-Python yardstick {yardstick_us():.1f} us",
        "servers": interpreter(python),
        "trajectory_log": trajectory_log,
        "seconds": seconds,
        "rounds": rounds,
        "concurrency": concurrency,
    }
    labels = (("latency", 1), ("throughput", concurrency))
    collected: dict[str, dict[str, list[dict[str, float]]]] = {
        label: {kind: [] for kind in ("bare", *REQUESTS)} for label, _ in labels
    }
    for round_ in range(rounds):
        profiled = {"BENCH_PROFILE": str(profile.resolve())} if profile is not None and round_ == 0 else {}
        servers = {"bare": start("bare", base_port, python=python)}
        try:
            servers["agent"] = start("agent", base_port + 1, {**env, **profiled}, python=python)
            asyncio.run(warm_up(urls["bare"], ["agent"]))
            asyncio.run(warm_up(urls["agent"], list(REQUESTS)))
            for label, clients in labels:
                bare = servers["bare"].pid
                collected[label]["bare"].append(
                    asyncio.run(load(urls["bare"], REQUESTS["agent"], clients, seconds, bare))
                )
                for kind, body in REQUESTS.items():
                    agent = servers["agent"].pid
                    collected[label][kind].append(asyncio.run(load(urls["agent"], body, clients, seconds, agent)))
        finally:
            for process in servers.values():
                process.terminate()
                process.wait(timeout=30)
    for label, _ in labels:
        results[label] = {kind: median_round(values) for kind, values in collected[label].items()}
    return results


def markdown(result: dict[str, Any]) -> str:
    lat, thr = result["latency"], result["throughput"]
    base_lat, base_thr = lat["bare"], thr["bare"]
    names = {
        "bare": "bare endpoint (canned completion)",
        "agent": "agent mode (episode: 2 generations + 1 tool call)",
        "agent_stream": "agent mode, streamed (SSE + agent events)",
        "tools_turn": "tools mode (one turn)",
    }
    lines = [
        f"Machine: {result['machine']}; {result['rounds']} rounds of {result['seconds']:g} s, median round; "
        f"the agent server {'writes' if result['trajectory_log'] else 'has no'} trajectory log.",
        "",
        f"Servers on {result['servers']}.",
        "",
        f"| endpoint | p50 latency (1 client) | added vs bare | req/s ({result['concurrency']} clients) "
        "| req/s ratio to bare | server CPU per request (ratio to bare) | of which the stand-in model "
        "| server's own CPU, model excluded (ratio to bare) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bare_cpu = base_thr["server_cpu_ms"]
    for kind, name in names.items():
        added = lat[kind]["p50_ms"] - base_lat["p50_ms"]
        row = thr[kind]
        lines.append(
            f"| {name} | {lat[kind]['p50_ms']:.2f} ms | {'' if kind == 'bare' else f'+{added:.2f} ms'} "
            f"| {row['rps']:.0f} | {row['rps'] / base_thr['rps']:.2f} "
            f"| {row['server_cpu_ms']:.3f} ms ({row['server_cpu_ms'] / bare_cpu:.2f}x) "
            f"| {row['model_cpu_ms']:.3f} ms | {row['own_cpu_ms']:.3f} ms ({row['own_cpu_ms'] / bare_cpu:.2f}x) |"
        )
    kernel = ", ".join(f"{names[kind].split(' (')[0]} {thr[kind]['system_cpu_ms']:.3f} ms" for kind in names)
    lines += ["", f"Of the server CPU per request, the kernel's (system time): {kernel}; the rest is user time."]
    return "\n".join(lines)


def _package(filename: str) -> str:
    """Where a profiled function lives: its top-level package, the standard library's module, or built-in."""
    if filename == "~":
        return "built-ins and C extensions (tokenizers, msgspec, ...)"
    parts = Path(filename).parts
    for marker in ("site-packages", "src"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py")
    if "tests" in parts:
        return "tests.support (the scripted engine's policy)"
    return f"stdlib {Path(filename).stem}"


def profile_table(path: Path, rows: int = 14) -> str:
    """The agent server's CPU time (cProfile, own time per function) summed per package, largest first."""
    import pstats

    totals: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in pstats.Stats(str(path)).stats.items():
        totals[_package(filename)] = totals.get(_package(filename), 0.0) + own
    whole = sum(totals.values())
    lines = [f"Agent server CPU under cProfile ({whole:.2f} s in all), by package:", "", "| package | CPU | share |"]
    lines.append("|---|---:|---:|")
    for name, seconds in sorted(totals.items(), key=lambda item: -item[1])[:rows]:
        lines.append(f"| {name} | {seconds:.2f} s | {seconds / whole:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measured round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per endpoint; the median is reported (default 3)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients in the throughput runs (default 16)")
    parser.add_argument("--port", type=int, default=18700, help="first of the two ports used (default 18700)")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the first round's agent server under cProfile and write its stats here (that round's CPU figures "
        "then include the profiler's overhead); `python -m pstats FILE` reads them",
    )
    parser.add_argument(
        "--trajectory-log",
        action="store_true",
        help="give the agent server a trajectory log, as `apps/serve --trajectory-log` does (off by default, as in "
        "apps/serve): every episode's record is written",
    )
    parser.add_argument(
        "--server-python",
        default=sys.executable,
        help="run both servers under this interpreter (say, a venv's python on an optimized CPython build, with "
        "this tree's packages, uvicorn, uvloop and httptools installed); the load generator stays on this one "
        "(default: this interpreter)",
    )
    parser.add_argument("--serve", choices=("bare", "agent"), help=argparse.SUPPRESS)  # child process mode
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as scratch:
        result = run(
            args.seconds,
            args.rounds,
            args.concurrency,
            args.port,
            Path(scratch),
            args.profile,
            args.trajectory_log,
            args.server_python,
        )
    print(markdown(result))
    if args.profile:
        print()
        print(profile_table(args.profile))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
