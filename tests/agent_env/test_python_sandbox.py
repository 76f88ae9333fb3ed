"""Escape probes against the python tool's sandbox: each one tries a route out and checks from outside.

Every probe runs once with the audit hooks on (what a model meets) and once with them off
(`audit_hooks=False`), which proves the kernel layers hold alone; and, where the kernel allows both, under
the namespace sandbox and under the fallback (`isolation="landlock"`: a subreaper and Landlock, no namespaces).
A probe never trusts what the snippet prints: it looks at the filesystem and the process table itself.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_env.errors import ToolError
from agent_env.tool import ToolContext
from agent_env.tool_runner import ToolRunner
from agent_env.tools import python as python_tool
from agent_env.tools.python import PythonTool, SandboxSupport, sandbox_support
from agent_protocol import ToolCall

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probes read Linux's /proc")

SUPPORT = sandbox_support()
MODES = [
    pytest.param("namespaces", marks=pytest.mark.skipif(not SUPPORT.namespaces, reason=SUPPORT.reason)),
    pytest.param("landlock", marks=pytest.mark.skipif(not SUPPORT.landlock, reason="no Landlock here")),
]


def run(code: str, **options: object) -> str:
    tool = PythonTool(**options)  # type: ignore[arg-type]
    return asyncio.run(tool.call(tool.parse_arguments({"code": code}), ToolContext()))


def spawn(argv: list[str], *, setsid: bool = False) -> str:
    """Snippet source that starts `argv` through `_posixsubprocess.fork_exec`, the route with no audit event."""
    args = [os.fsencode(a) for a in argv]
    return (
        "import _posixsubprocess, os\n"
        "r, w = os.pipe()\n"
        f"_posixsubprocess.fork_exec({args!r}, [{args[0]!r}], True, (w,), None, None, -1, -1, -1, -1, -1, -1,"
        f" r, w, False, {setsid}, -1, None, None, None, -1, None, False)\n"
        "print('spawned', flush=True)\n"
    )


def sleeper_argv(marker: str) -> list[str]:
    """A child that sleeps 30 s, found in the process table by `marker`."""
    return [sys.executable, "-c", "import time; time.sleep(30)", marker]


def detached_sleeper() -> tuple[str, str]:
    """A fresh marker, and snippet source that starts a `setsid` sleeper carrying it (through fork_exec)."""
    marker = f"agent-env-probe-{uuid.uuid4().hex}"
    return marker, spawn(sleeper_argv(marker), setsid=True)


def sandboxes_running() -> int:
    """How many calls have a live process, counted by their distinct work dirs in the process table."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            found.update(re.findall(rb"agent-env-python-[A-Za-z0-9_]+", cmdline))
    return len(found)


def survivors(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def write_probes(outside: Path, victim: Path) -> dict[str, str]:
    """Snippets that each try to change something under `outside` / `victim` (both outside the work dir)."""
    target = str(outside / "escaped.txt")
    return {
        "fork_exec": spawn(["/bin/sh", "-c", f"echo x > {target}"]) + "import time; time.sleep(0.5)",
        "sqlite3": f"import sqlite3; sqlite3.connect({target!r}).execute('create table t (x)')",
        "sqlite3_attach": f"import sqlite3; sqlite3.connect(':memory:').execute(\"attach database '{target}' as e\")"
        ".execute('create table e.t (x)')",
        "dir_fd": f"import os; d = os.open({str(outside)!r}, os.O_RDONLY)\n"
        "os.write(os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=d), b'x')",
        "link_append": f"import os; os.link({str(victim)!r}, 'mine.txt'); open('mine.txt', 'a').write('pwned')",
        "rename_in": f"import os; os.rename({str(victim)!r}, 'mine.txt')",
        "rename_dir_fd": f"import os; d = os.open({str(outside)!r}, os.O_RDONLY)\n"
        "open('mine.txt', 'w').write('x'); os.rename('mine.txt', 'escaped.txt', dst_dir_fd=d)",
        "symlink_swap": f"import os; os.symlink({str(outside)!r}, 'link'); open('link/escaped.txt', 'w').write('x')",
        "proc_root": f"import os; open('/proc/{os.getpid()}/root{target}', 'w').write('x')",
        "chmod_fd": f"import os; fd = os.open({str(victim)!r}, os.O_RDONLY); os.chmod(fd, 0o777)",
    }


def changed(outside: Path) -> str:
    """What a probe changed in its folder ("" when nothing)."""
    victim = outside / "victim.txt"
    names = sorted(p.name for p in outside.iterdir())
    if names != ["victim.txt"]:
        return f"folder now holds {names}"
    if victim.read_text() != "keep me" or (victim.stat().st_mode & 0o777) != 0o644:
        return f"victim changed: {victim.read_text()!r}, mode {victim.stat().st_mode & 0o777:o}"
    return ""


PROBES = sorted(write_probes(Path("/x"), Path("/x/v")))


def escapes(tmp_path: Path, **options: object) -> tuple[dict[str, str], dict[str, str]]:
    """Run every write probe at once, each against its own folder: ({probe: what it changed}, {probe: output})."""
    folders = {}
    for name in PROBES:
        folder = tmp_path / name
        folder.mkdir()
        folder.chmod(0o777)  # writable by anyone: only the sandbox stands between a snippet and this folder
        (folder / "victim.txt").write_text("keep me")
        (folder / "victim.txt").chmod(0o644)
        folders[name] = folder
    tool = PythonTool(max_concurrent=len(PROBES), **options)  # type: ignore[arg-type]

    async def probe(name: str) -> str:
        code = write_probes(folders[name], folders[name] / "victim.txt")[name]
        return await tool.call(tool.parse_arguments({"code": code}), ToolContext())

    async def all_probes() -> list[str]:
        return await asyncio.gather(*(probe(name) for name in PROBES))

    outputs = dict(zip(PROBES, asyncio.run(all_probes()), strict=True))
    return {name: changed(folder) for name, folder in folders.items() if changed(folder)}, outputs


def test_no_write_outside_with_the_audit_hooks_on(tmp_path: Path) -> None:
    escaped, outputs = escapes(tmp_path)
    assert escaped == {}
    assert all("Error" in output for output in outputs.values()), outputs


@pytest.mark.parametrize("mode", MODES)
def test_no_write_outside_on_the_kernel_layers_alone(tmp_path: Path, mode: str) -> None:
    escaped, outputs = escapes(tmp_path, audit_hooks=False, isolation=mode)
    # Landlock has no right for chmod/chown: without namespaces that route rests on the hook and the uid
    known_gap = {"chmod_fd"} if mode == "landlock" and os.geteuid() == 0 else set()
    assert set(escaped) <= known_gap, (escaped, outputs)


@pytest.mark.parametrize("mode", MODES)
def test_no_device_sysctl_or_shared_memory_opens_for_writing(mode: str) -> None:
    """Opened for writing, never written: each would succeed for the tool's own uid outside the sandbox."""
    shm = f"/dev/shm/agent-env-probe-{uuid.uuid4().hex}"
    code = (
        "import glob, os\n"
        f"targets = [{shm!r}, '/proc/sys/kernel/hostname']\n"
        "targets += sorted(glob.glob('/dev/[sv]d[a-z]') + glob.glob('/dev/nvme[0-9]n[0-9]'))[:1]\n"
        "for t in targets:\n"
        "    try:\n"
        "        os.close(os.open(t, os.O_WRONLY | (os.O_CREAT if 'shm' in t else 0))); print('opened', t)\n"
        "    except OSError as e:\n"
        "        print('refused', t)\n"
    )
    try:
        output = run(code, audit_hooks=False, isolation=mode)
    finally:
        Path(shm).unlink(missing_ok=True)
    assert "opened" not in output and output.count("refused") >= 2, output


def test_the_kernel_layers_leave_the_work_dir_writable() -> None:
    code = "import os\nopen('a', 'w').write('1'); os.mkdir('d'); os.rename('a', 'd/b'); print(open('d/b').read())"
    for mode in [m.values[0] for m in MODES]:
        if (mode == "namespaces" and not SUPPORT.namespaces) or (mode == "landlock" and not SUPPORT.landlock):
            continue
        assert run(code, audit_hooks=False, isolation=mode) == "1"


@pytest.mark.parametrize("mode", MODES)
def test_setsid_children_do_not_outlive_the_call(mode: str) -> None:
    marker = f"agent-env-probe-{uuid.uuid4().hex}"
    sleeper = sleeper_argv(marker)
    code = (
        "import os, sys\n"
        "for _ in range(20):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        f"            os.execv({sys.executable!r}, {sleeper!r})\n"
        "        os._exit(0)\n"
        "print('spawned')"
    )
    assert run(code, audit_hooks=False, isolation=mode, wall_time_s=5).startswith("spawned")
    assert survivors(marker) == []


def test_setsid_children_started_through_fork_exec_do_not_outlive_the_call() -> None:
    marker, one = detached_sleeper()
    code = one * 20
    run(code, wall_time_s=5)
    assert survivors(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_the_call_returns_when_the_snippet_ends_though_a_child_holds_stdout(mode: str) -> None:
    marker, code = detached_sleeper()
    started = time.monotonic()
    assert run(code, audit_hooks=False, isolation=mode, wall_time_s=10) == "spawned"
    assert time.monotonic() - started < 5
    assert survivors(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_the_wall_clock_kills_the_whole_tree(mode: str) -> None:
    marker, code = detached_sleeper()
    code += "import time\ntime.sleep(30)"
    started = time.monotonic()
    with pytest.raises(ToolError, match="wall-clock limit of 1 s") as caught:
        run(code, audit_hooks=False, isolation=mode, wall_time_s=1)
    assert caught.value.code == "timeout" and "spawned" in (caught.value.hint or "")
    assert time.monotonic() - started < 5
    assert survivors(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_call_leaves_no_process(mode: str) -> None:
    marker, code = detached_sleeper()
    code += "import time\ntime.sleep(30)"
    tool = PythonTool(audit_hooks=False, isolation=mode)  # type: ignore[arg-type]

    async def cancelled() -> None:
        call = asyncio.ensure_future(tool.call(tool.parse_arguments({"code": code}), ToolContext()))
        await asyncio.sleep(1.0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(cancelled())
    assert survivors(marker) == []


def test_a_child_holding_stdout_is_no_timeout_with_the_hooks_on() -> None:
    marker, code = detached_sleeper()
    started = time.monotonic()
    output = run(code, wall_time_s=10)
    assert time.monotonic() - started < 5 and survivors(marker) == []
    assert "fork_exec is not allowed" in output


@pytest.mark.parametrize(
    ("code", "event"),
    [
        (spawn(["/bin/true"]), "fork_exec"),
        ("import os; os.posix_spawn('/bin/true', ['true'], {})", "os.posix_spawn"),
        ("import os; os.forkpty()", "os.forkpty"),
        ("import pty; pty.fork()", "out of pty devices"),  # forkpty refused, then no pty device to open
        ("import multiprocessing as m\nif __name__ == '__main__':\n    m.Process(target=print).start()", "os.fork"),
        (
            "import multiprocessing as m\nif __name__ == '__main__':\n"
            "    m.set_start_method('spawn'); m.Process(target=print).start()",
            "fork_exec",
        ),
        ("import importlib, sys; del sys.modules['_posixsubprocess']; import _posixsubprocess", "_posixsubprocess"),
    ],
    ids=["fork_exec", "posix_spawn", "forkpty", "pty", "multiprocessing_fork", "multiprocessing_spawn", "reimport"],
)
def test_every_process_route_trips_the_audit_hooks(code: str, event: str) -> None:
    output = run(code)
    assert event in output and (("PermissionError" in output and "not allowed" in output) or "pty" in event), output


SLEEPER = "import time; time.sleep(0.3); print('ok')"


def _with_peak(calls: Callable[[], Awaitable[list[str]]]) -> tuple[list[str], int]:
    """Run `calls()` while a thread samples how many sandboxes are alive; the outputs and the peak."""
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, sandboxes_running())
            time.sleep(0.02)

    async def main() -> list[str]:
        watcher = asyncio.create_task(asyncio.to_thread(watch))
        try:
            return await calls()
        finally:
            stop.set()
            await watcher

    return asyncio.run(main()), peak


def test_concurrent_calls_are_capped() -> None:
    tool = PythonTool(max_concurrent=2)

    async def calls() -> list[str]:
        arguments = tool.parse_arguments({"code": SLEEPER})
        return list(await asyncio.gather(*(tool.call(arguments, ToolContext()) for _ in range(6))))

    started = time.monotonic()
    outputs, peak = _with_peak(calls)
    assert outputs == ["ok"] * 6
    assert time.monotonic() - started >= 3 * 0.3
    assert 1 <= peak <= 2


def test_max_concurrent_is_validated() -> None:
    with pytest.raises(ValueError, match="max_concurrent"):
        PythonTool(max_concurrent=0)


def pretend(monkeypatch: pytest.MonkeyPatch, support: SandboxSupport) -> None:
    monkeypatch.setattr(python_tool, "sandbox_support", lambda python=None: support)


def test_forcing_a_missing_layer_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend(monkeypatch, SandboxSupport(namespaces=False, landlock=False, reason="unshare refused"))
    with pytest.raises(ToolError, match="namespace sandbox is not available here: unshare refused"):
        run("print(1)", isolation="namespaces")
    with pytest.raises(ToolError, match="Landlock sandbox is not available"):
        run("print(1)", isolation="landlock")
    with pytest.raises(ValueError, match="isolation"):
        PythonTool(isolation="none")  # type: ignore[arg-type]


def test_auto_without_namespaces_falls_back_to_the_subreaper(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend(monkeypatch, SandboxSupport(namespaces=False, landlock=SUPPORT.landlock, reason="pretended"))
    marker = f"agent-env-probe-{uuid.uuid4().hex}"
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv({sys.executable!r}, {sleeper_argv(marker)!r})\n"
        "print(os.getpid() > 2)"
    )
    assert run(code, audit_hooks=False) == "True"  # not PID 2 of a fresh namespace
    assert survivors(marker) == []


@pytest.mark.parametrize("mode", MODES)
def test_the_snippet_has_no_capabilities(mode: str) -> None:
    status = run("print(open('/proc/self/status').read())", isolation=mode, audit_hooks=False)
    caps = dict(line.split(":\t") for line in status.splitlines() if line.startswith("Cap"))
    assert {caps[k].strip() for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")} == {"0" * 16}, caps


def test_the_namespace_sandbox_is_what_runs_by_default_here() -> None:
    if not SUPPORT.namespaces:
        pytest.skip(SUPPORT.reason)
    # pid 2 in a fresh PID namespace (1 is the sandbox's own init), and / is mounted read-only
    output = run("import os\nprint(os.getpid(), bool(os.statvfs('/').f_flag & os.ST_RDONLY))")
    assert output == "2 True"


def test_concurrent_calls_through_the_tool_runner_are_capped_too() -> None:
    """The runner runs async tools on a loop of their own unless they share the caller's; the python tool
    shares it, so its per-loop cap holds for calls from many episodes at once."""
    runner = ToolRunner([PythonTool(max_concurrent=2)])
    calls = [ToolCall(id=f"c{i}", name="python", arguments={"code": SLEEPER}) for i in range(6)]

    async def run_all() -> list[str]:
        batches = await asyncio.gather(*(runner.run([call]) for call in calls))
        return [obs.content.strip() for batch in batches for obs in batch]

    outputs, peak = _with_peak(run_all)
    assert outputs == ["ok"] * 6
    assert 1 <= peak <= 2
