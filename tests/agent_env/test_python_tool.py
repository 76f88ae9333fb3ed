"""The python tool's limits, proven: time, memory, files, network, processes, output."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_env import FunctionCallEnvironment
from agent_env.errors import ToolError
from agent_env.tool import ToolContext
from agent_env.tools.python import PythonTool
from agent_protocol.types import Action, ToolCall

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the python tool needs POSIX rlimits")


def run(code: str, **options: object) -> str:
    tool = PythonTool(**options)  # type: ignore[arg-type]
    return asyncio.run(tool.call(tool.parse_arguments({"code": code}), ToolContext()))


def failure(code: str, **options: object) -> ToolError:
    with pytest.raises(ToolError) as caught:
        run(code, **options)
    return caught.value


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def accepted_any(server: socket.socket) -> bool:
    readable, _, _ = select.select([server], [], [], 0.2)
    return bool(readable)


def test_output_exit_code_and_traceback() -> None:
    assert run("print(6 * 7)") == "42"
    assert run("pass") == "(no output)"
    assert run("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)") == (
        "out\n[stderr]\nerr\n[exit code 3]"
    )
    crashed = run("x = 1\n1 / x\nraise ValueError('bad value')")
    assert crashed.startswith('[stderr]\nTraceback (most recent call last):\n  File "snippet.py", line 3')
    assert "ValueError: bad value" in crashed and "<string>" not in crashed and crashed.endswith("[exit code 1]")


def test_an_infinite_loop_is_stopped_at_the_cpu_limit() -> None:
    started = time.monotonic()
    error = failure("while True:\n    pass", cpu_time_s=1, wall_time_s=20)
    assert error.code == "timeout" and "CPU time limit of 1 s" in error.message
    assert time.monotonic() - started < 6


def test_a_sleeping_snippet_is_stopped_at_the_wall_clock_limit() -> None:
    started = time.monotonic()
    error = failure("import time\nprint('before', flush=True)\ntime.sleep(60)", wall_time_s=1)
    assert error.code == "timeout" and "wall-clock limit of 1 s" in error.message
    assert "before" in (error.hint or "")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(4 * 1024 ** 3)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))"],
    ids=["one-allocation", "growing"],
)
def test_a_memory_bomb_is_killed(code: str) -> None:
    error = failure(code, memory_mb=256, cpu_time_s=10)
    assert error.code == "tool_error" and "memory limit of 256 MB" in error.message


def test_memory_below_the_limit_is_fine() -> None:
    assert run("x = bytearray(50 * 1024 ** 2); print(len(x))", memory_mb=256) == str(50 * 1024**2)


def test_writing_outside_the_working_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for code in (
        f"open({str(outside)!r}, 'w').write('x')",
        "open('../escaped.txt', 'w').write('x')",
        f"import os; os.remove({str(victim)!r})",
        f"import os; os.rename({str(victim)!r}, 'mine.txt')",
        f"import pathlib; pathlib.Path({str(tmp_path / 'new_dir')!r}).mkdir()",
        "import os; os.symlink('/etc', 'link'); open('link/escaped', 'w')",
    ):
        output = run(code)
        assert "PermissionError" in output and "not allowed" in output, code
    assert not outside.exists() and victim.read_text() == "keep me" and not (tmp_path / "new_dir").exists()
    assert not (Path("/etc") / "escaped").exists()


def test_files_inside_the_working_directory_work_and_vanish() -> None:
    code = (
        "import os, tempfile\n"
        "open('notes.txt', 'w').write('hello')\n"
        "os.mkdir('sub'); open('sub/a.txt', 'w').write('a')\n"
        "with tempfile.NamedTemporaryFile('w', delete=False) as f: f.write('t')\n"
        "print(open('notes.txt').read(), os.getcwd())"
    )
    text, workdir = run(code).split()
    assert text == "hello"
    assert not Path(workdir).exists()


def test_a_network_connection_fails(listener: socket.socket) -> None:
    host, port = listener.getsockname()
    code = f"import socket\ns = socket.create_connection(({host!r}, {port}), timeout=2)\nprint('connected')"
    output = run(code)
    assert "connected" not in output.replace("[stderr]", "")
    assert "network access is disabled" in output
    assert not accepted_any(listener)
    raw = run(f"import _socket\ns = _socket.socket()\ns.connect(({host!r}, {port}))")
    assert "network access is disabled" in raw and not accepted_any(listener)


def test_the_same_connection_works_when_network_is_allowed(listener: socket.socket) -> None:
    host, port = listener.getsockname()
    code = f"import socket\ns = socket.create_connection(({host!r}, {port}), timeout=2)\nprint('connected')"
    assert run(code, allow_network=True) == "connected"
    assert accepted_any(listener)


def test_processes_and_signals_are_refused() -> None:
    for code, event in (
        ("import subprocess; subprocess.run(['true'])", "subprocess.Popen"),
        ("import os; os.system('true')", "os.system"),
        ("import os; os.fork()", "os.fork"),
        ("import os; os.kill(os.getppid(), 15)", "signalling other processes"),
        ("import ctypes; ctypes.CDLL(None).getpid()", "ctypes.dlsym"),
    ):
        output = run(code)
        assert "PermissionError" in output and event in output, code


def test_parent_environment_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_ENV_TEST_SECRET", "hunter2")
    assert run("import os; print(os.environ.get('AGENT_ENV_TEST_SECRET'))") == "None"


def test_long_output_is_cut_while_reading() -> None:
    output = run("print('y' * 100000)", max_stream_bytes=1000)
    assert output.startswith("y" * 1000 + "\n[... ")
    assert "more bytes not shown]" in output


def test_through_an_environment_limits_are_observations() -> None:
    python = PythonTool(cpu_time_s=1, wall_time_s=5)
    env = FunctionCallEnvironment(tools=[python], max_output_chars=200)
    calls = (
        ToolCall(id="a", name="python", arguments={"code": "print(sum(range(10)))"}),
        ToolCall(id="b", name="python", arguments={"code": "while True: pass"}),
        ToolCall(id="c", name="python", arguments={"code": "print('z' * 1000)"}),
        ToolCall(id="d", name="python", arguments={"source": "1"}),
    )
    ok, looped, long, bad = asyncio.run(env.step(Action(tool_calls=calls))).observations
    assert ok.ok and ok.content == "45"
    assert looped.code == "timeout" and json.loads(looped.content)["error"]["code"] == "timeout"
    assert long.code == "output_truncated"
    assert bad.code == "invalid_arguments"
    assert python.timeout_s == 10.0
