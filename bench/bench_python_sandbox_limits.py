"""What one python-tool call can take from the host, with the tool's default limits, measured from outside.

Four hostile snippets, each through `PythonTool()` as a model meets it (defaults; the fork storm with the audit
hooks off, since the hook refuses ``os.fork`` and only the kernel's caps count), watched by
`tests.support.sandbox_watch.SandboxWatch` (host disk beneath the calls' temp root; the calls' process trees
in the host's /proc: tasks and Pss):

- litter: a chain 1100 levels deep and past PATH_MAX, a dir at mode 000, one at 0500: what is left on the
  host after the call;
- writer: 1 MiB files until 256 MiB (it stops itself there): the host disk's peak, and how the call ended;
- fork storm: 100 children holding 24 MiB each (2.4 GiB, 101 processes uncapped): the tree's peak tasks and Pss;
- seeker: a call that looks for a concurrent call's secret file for 1 s: found or not;
- and what the layers cost: the median wall time of `--calls` calls of ``print(1)``, one at a time.

Only options every version of the tool takes are used, so the same script measures an older checkout:
``PYTHONPATH=<checkout>/packages/agent-env/src:... uv run python bench/bench_python_sandbox_limits.py``.

    uv run python bench/bench_python_sandbox_limits.py [--isolation auto|namespaces|landlock] [--calls 20]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_env.errors import ToolError  # noqa: E402
from agent_env.tool import ToolContext  # noqa: E402
from agent_env.tools.python import PythonTool, sandbox_support  # noqa: E402
from tests.support.hostile_snippets import SEEKER, litter  # noqa: E402
from tests.support.sandbox_watch import SandboxWatch, allocated_beneath, files_beneath  # noqa: E402


def _remove_tree() -> Callable[[str], None]:
    """This checkout's `remove_tree` (standard library only), loaded by path: an older tool under test has none."""
    path = ROOT / "packages/agent-env/src/agent_env/tools/_sandbox_cleanup.py"
    spec = importlib.util.spec_from_file_location("bench_sandbox_cleanup", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.remove_tree  # type: ignore[no-any-return]


remove_tree = _remove_tree()

WRITER = "for i in range(256):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\nprint('wrote 256 MiB')\n"
STORM = """import os, time
started = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError as error:
        print('fork refused:', error.strerror)
        break
    if pid == 0:
        data = b'x' * (24 << 20)
        time.sleep(1.0)
        os._exit(0)
    started += 1
print('started', started)
for _ in range(started):
    os.wait()
"""


async def one(tool: PythonTool, code: str) -> str:
    try:
        output = await tool.call(tool.parse_arguments({"code": code}), ToolContext())
    except ToolError as error:
        return f"ToolError: {error.message}"
    except Exception as error:  # an older tool's own failure (e.g. its cleanup) is a result here too
        return f"{type(error).__name__}: {error}"
    return output.splitlines()[-1] if output else output


def scenario(name: str, code: str, isolation: str, **options: object) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    tool = PythonTool(temp_root=str(root), isolation=isolation, **options)  # type: ignore[arg-type]
    with SandboxWatch(root, interval=0.01) as watch:
        result = asyncio.run(one(tool, code))
    left = allocated_beneath(root)
    print(f"{name:10} {watch.report()}; left on the host: {left / 2**20:.1f} MiB {files_beneath(root)[:3]}")
    remove_tree(str(root))
    print(f"{'':10} -> {result[:150]}")


def seeker(isolation: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    tool = PythonTool(temp_root=str(root), isolation=isolation, max_concurrent=2)  # type: ignore[arg-type]
    secret = uuid.uuid4().hex
    holder = f"open('secret.txt', 'w').write({secret!r})\nimport time; time.sleep(2)"

    async def both() -> list[str]:
        async def seek() -> str:
            await asyncio.sleep(0.5)
            return await one(tool, SEEKER)

        return list(await asyncio.gather(one(tool, holder), seek()))

    _, sought = asyncio.run(both())
    remove_tree(str(root))
    print(f"{'seeker':10} the other call's secret {'FOUND' if secret in sought else 'not found'} ({sought[:80]})")


def latency(isolation: str, calls: int) -> None:
    tool = PythonTool(isolation=isolation)  # type: ignore[arg-type]

    async def timed() -> list[float]:
        arguments, took = tool.parse_arguments({"code": "print(1)"}), []
        for _ in range(calls):
            started = time.perf_counter()
            await tool.call(arguments, ToolContext())
            took.append(time.perf_counter() - started)
        return took

    took = asyncio.run(timed())
    print(f"{'print(1)':10} median {statistics.median(took) * 1000:.1f} ms a call over {calls} calls")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isolation", default="auto", choices=["auto", "namespaces", "landlock"])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    print(f"{sandbox_support()}\nisolation={args.isolation}, the tool's default limits")
    scenario("litter", litter(Path("/nonexistent")), args.isolation)
    scenario("writer", WRITER, args.isolation)
    scenario("fork storm", STORM, args.isolation, audit_hooks=False)
    seeker(args.isolation)
    latency(args.isolation, args.calls)


if __name__ == "__main__":
    main()
