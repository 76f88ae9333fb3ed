"""Where an agent-mode request's server CPU goes, measured in process: the app called as ASGI (no sockets, no HTTP
client), under uvloop as uvicorn runs it, 16 requests in flight, the stand-in model's CPU excluded.

`bench/bench_serve.py` measures the whole server over HTTP, but on a shared 2-core host its figures move with the
host's speed (the load generator shares the cores) and cannot resolve a change of a few percent. In process, with
the configurations taking turns round after round, they can. Each configuration runs in child processes of its
own (logging is configured once per process, as `apps/serve` does), built as `bench_serve.py` builds its servers:

  bare                 the same bare Starlette endpoint (reads the body, returns a canned completion)
  agent                apps/serve's defaults: the calculator recipe on the scripted stand-in model, JSON logs at
                       info (one `request_served` line per request), no trajectory log
  agent + trajectory   the same, writing every episode's record to a trajectory log (`--trajectory-log`;
                       `bench_serve.py --trajectory-log` gives its agent server one too)
  agent, no log line   the same as agent, logging at warning (no line per request)

A request is agent mode's (`bench_serve.REQUESTS["agent"]`: two generations and one calculator call). Each
configuration runs in `--processes` children (3 by default): one process of the same code runs some 5 % faster or
slower than another for its whole life (where its memory and its hash tables happen to fall), more than the
differences sought, so one child per configuration gave differences of tens of microseconds between identical
configurations. For each configuration the table gives the median over all its children's batches of the CPU per
request (the process's CPU time over a batch, less what the stand-in model reports, over the requests), the range
of its children's own medians, and its difference from agent: what the trajectory log and the request's log line
cost. What HTTP adds (sockets, uvicorn's parser) is not here, so these are no ratios for issue 43's bar (which
`bench_serve.py` measures over HTTP, where the bare endpoint costs about 0.1 ms a request, nearly all of it HTTP).

With `--baseline DIR` (a checkout of another commit, say `git worktree add /tmp/base HEAD~3`), one more
configuration takes its turns in the same rounds: agent mode as above, run on DIR's packages (agent-protocol,
agent-env, agent-runtime) instead of this tree's, in as many children. Rounds in one run see the same host, so
the difference is what the commits between them changed, to several microseconds (this tree as its own baseline
came out 1 us apart with 3 children each, 18 us apart with one), where two runs of the HTTP bench differ by more.

With `--baseline-python PATH` the baseline configuration's children run under another interpreter (a virtual
environment's python with this tree's packages installed, on another CPython build, say): with `--baseline` too, on
DIR's packages; without it, on this tree's, so the difference is the interpreter's alone. `--python PATH` runs every
other child under PATH. The header names each interpreter's build (`bench_serve.interpreter`).

    uv run python bench/bench_serve_parts.py [--requests 1600] [--rounds 5] [--processes 3] [--baseline DIR]
                                             [--python PATH] [--baseline-python PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CONCURRENCY = 16
CONFIGS: dict[str, str] = {
    "bare": "bare endpoint (canned completion)",
    "agent": "agent mode, apps/serve's defaults (a log line per request, no trajectory log)",
    "agent_trajectory": "agent mode + a trajectory log (`--trajectory-log`)",
    "agent_quiet": "agent mode, logging at warning (no log line per request)",
}
BASELINE = "agent_baseline"  # agent's configuration on another checkout's packages (`--baseline`)
PACKAGES = ("agent-protocol", "agent-env", "agent-runtime")


# -- a child: one configuration, driven over stdin ----------------------------------------------------------------


def build(config: str, scratch: Path) -> Any:
    import bench_serve

    if config == "bare":
        return bench_serve.bare_app()
    if config == BASELINE:
        config = "agent"
    return bench_serve.agent_app(
        trajectory_log=str(scratch / "trajectories.jsonl") if config == "agent_trajectory" else None,
        log_level="warning" if config == "agent_quiet" else "info",
    )


class Driver:
    """Sends `bench_serve.REQUESTS["agent"]` to an ASGI app, as uvicorn would hand it one: the body delivered on a
    later loop iteration, then nothing more from the client (`receive` waits, as for a client that stays)."""

    def __init__(self, app: Any) -> None:
        import bench_serve

        self.app = app
        self.body = json.dumps(bench_serve.REQUESTS["agent"]).encode()
        self.scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
            "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(self.body)).encode())],
        }  # fmt: skip

    async def one(self) -> None:
        delivered = False
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                await asyncio.sleep(0)  # a socket hands the body over on a later iteration
                delivered = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            await never.wait()
            return {"type": "http.disconnect"}

        status: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await self.app(dict(self.scope), receive, send)
        if status != [200]:
            raise RuntimeError(f"the app answered {status}, not 200")

    async def batch(self, requests: int) -> dict[str, float]:
        """CPU per request over `requests` requests, `CONCURRENCY` at a time; the stand-in model's share apart."""
        engine = getattr(self.app.state, "backend", None)
        engine = engine.engine if engine is not None else None

        def model_s() -> float:
            return float(engine.stats()["model_cpu_s"]) if engine is not None else 0.0

        each = requests // CONCURRENCY

        async def client() -> None:
            for _ in range(each):
                await self.one()

        model0, cpu0 = model_s(), time.process_time()
        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        cpu, model = time.process_time() - cpu0, model_s() - model0
        n = each * CONCURRENCY
        return {"own_us": (cpu - model) / n * 1e6, "model_us": model / n * 1e6}


def child(config: str) -> None:
    """Build `config`'s app, then answer each line "N" on stdin with one JSON line: a batch of N requests."""
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench_serve_parts_") as scratch:
        app = build(config, Path(scratch))
        driver = Driver(app)

        async def serve() -> None:
            async with app.router.lifespan_context(app):
                for _ in range(200):  # warm up: caches, the piece cache, the allocator
                    await driver.one()
                print("ready", flush=True)
                loop = asyncio.get_running_loop()
                while line := await loop.run_in_executor(None, sys.stdin.readline):
                    result = await driver.batch(int(line))
                    print(json.dumps(result), flush=True)

        uvloop.run(serve())


# -- the parent: rounds over the configurations ----------------------------------------------------------------


def run(
    requests: int,
    rounds: int,
    scratch: Path,
    baseline: Path | None = None,
    processes: int = 3,
    python: str = sys.executable,
    baseline_python: str | None = None,
) -> dict[str, Any]:
    """`rounds` rounds, each a batch of `requests` from every child of every configuration in turn (`processes`
    children a configuration; the order reversed every other round), run by `python` (the baseline's by
    `baseline_python` when given). The children's stderr (their log lines) goes to files in `scratch`; a failure
    shows its end."""
    import bench_serve

    def failed(child: tuple[str, int], what: str) -> RuntimeError:
        process = children[child]
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        tail = (scratch / f"{child[0]}.{child[1]}.stderr").read_text(errors="replace")[-2000:]
        return RuntimeError(
            f"the {child[0]} child {child[1]} {what} (exit status {process.poll()}); its stderr ends:\n{tail}"
        )

    with_baseline = baseline is not None or baseline_python is not None
    configs = [*CONFIGS, *([BASELINE] if with_baseline else [])]

    def environment(config: str) -> dict[str, str]:
        if config != BASELINE or baseline is None:
            return dict(os.environ)
        paths = [str(baseline / "packages" / name / "src") for name in PACKAGES]
        inherited = os.environ.get("PYTHONPATH")  # an empty entry would put the working directory on the path
        return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([inherited] if inherited else [])])}

    def start(config: str, index: int) -> subprocess.Popen[str]:
        with (scratch / f"{config}.{index}.stderr").open("w") as stderr:  # the child holds its own copy of it
            return subprocess.Popen(
                [baseline_python if config == BASELINE and baseline_python else python, __file__, "--child", config],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=ROOT,
                env=environment(config),
            )

    # children of one configuration take turns with the others': (bare 0, agent 0, ..., bare 1, agent 1, ...)
    keys = [(config, index) for index in range(processes) for config in configs]
    children = {key: start(*key) for key in keys}
    try:
        for key, process in children.items():
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                raise failed(key, "did not start")
        measured: dict[tuple[str, int], list[dict[str, float]]] = {key: [] for key in keys}
        for round_ in range(rounds):
            for key in keys if round_ % 2 == 0 else keys[::-1]:
                process = children[key]
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write(f"{requests}\n")
                process.stdin.flush()
                line = process.stdout.readline()
                if not line:
                    raise failed(key, "stopped")
                measured[key].append(json.loads(line))
    finally:
        for process in children.values():
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    pooled = {c: [r for i in range(processes) for r in measured[(c, i)]] for c in configs}  # all its children's
    return {
        "requests": requests,
        "rounds": rounds,
        "processes": processes,
        "load_average": os.getloadavg()[0],
        "baseline": str(baseline) if baseline is not None else None,
        "python": bench_serve.interpreter(python),
        "baseline_python": bench_serve.interpreter(baseline_python) if baseline_python else None,
        "median": {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in pooled.items()},
        "process_medians_own_us": {
            c: [round(statistics.median(r["own_us"] for r in measured[(c, i)]), 1) for i in range(processes)]
            for c in configs
        },
        "rounds_own_us": {c: [round(r["own_us"], 1) for r in rs] for c, rs in pooled.items()},
    }


def markdown(result: dict[str, Any]) -> str:
    median = result["median"]
    agent = median["agent"]["own_us"]
    lines = [
        f"{result['rounds']} rounds of {result['requests']} requests per child, {result['processes']} children per "
        f"configuration, {CONCURRENCY} requests in flight; the median batch; load average "
        f"{result['load_average']:.1f} at the end. Children on {result['python']}.",
        "",
        "| configuration | server CPU per request, model excluded | its children's medians | difference from agent |",
        "|---|---:|---:|---:|",
    ]
    names = dict(CONFIGS)
    if result.get("baseline") or result.get("baseline_python"):
        packages = f"the baseline's packages ({result['baseline']})" if result.get("baseline") else "this tree"
        on = f", on {result['baseline_python']}" if result.get("baseline_python") else ""
        names[BASELINE] = f"agent mode, apps/serve's defaults, on {packages}{on}"
    for config, name in names.items():
        own = median[config]["own_us"]
        spread = result["process_medians_own_us"][config]
        difference = "" if config in ("bare", "agent") else f"{own - agent:+.0f} us"
        lines.append(f"| {name} | {own:.0f} us | {min(spread):.0f}-{max(spread):.0f} us | {difference} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1600, help="requests per configuration per round (1600)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    parser.add_argument(
        "--processes",
        type=int,
        default=3,
        help="children per configuration (default 3): one process runs a few percent faster or slower than another "
        "of the same code for its whole life, so a configuration is measured in several",
    )
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another commit (a git worktree): agent mode on its packages takes turns in the same "
        "rounds, for a before-and-after of the commits between",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter of every child but the baseline's (default: this one); it must have this tree's "
        "packages, starlette, uvicorn and uvloop installed",
    )
    parser.add_argument(
        "--baseline-python",
        help="the interpreter of the baseline's children (on --baseline's packages, or this tree's without it): "
        "another CPython build measured in the same rounds",
    )
    parser.add_argument("--child", choices=(*CONFIGS, BASELINE), help=argparse.SUPPRESS)  # a configuration's process
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.requests < CONCURRENCY or args.rounds < 1 or args.processes < 1:
        parser.error(f"--requests must be at least {CONCURRENCY}, --rounds and --processes at least 1")
    if args.baseline is not None:
        missing = [name for name in PACKAGES if not (args.baseline / "packages" / name / "src").is_dir()]
        if missing:
            parser.error(
                f"--baseline {args.baseline}: not a checkout of this repository (no packages/{missing[0]}/src)"
            )
        args.baseline = args.baseline.resolve()
    for option, path in (("--python", args.python), ("--baseline-python", args.baseline_python)):
        if path is not None and not os.access(path, os.X_OK):
            parser.error(f"{option} {path}: not an executable file")
    with tempfile.TemporaryDirectory(prefix="bench_serve_parts_") as scratch:
        result = run(
            args.requests,
            args.rounds,
            Path(scratch),
            args.baseline,
            args.processes,
            args.python,
            args.baseline_python,
        )
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
