"""What a python-tool call may take from the host, checked from outside: files left, disk, memory, processes.

Each test runs under the namespace sandbox (a tmpfs work dir, cgroup caps where this host has them) and under
the fallback (`isolation="landlock"`: the host's disk, watched), where the kernel allows each. A
`SandboxWatch` samples the host disk beneath the calls' temp root and the calls' process trees in the host's
/proc while they run; `pytest -s` prints the peaks. Nothing a snippet prints is trusted.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest

from agent_env.errors import ToolError
from agent_env.tool import ToolContext
from agent_env.tools.python import PythonTool, sandbox_support
from tests.support.hostile_snippets import SEEKER, litter
from tests.support.sandbox_watch import SandboxWatch, files_beneath

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watch reads Linux's /proc")

SUPPORT = sandbox_support()
MODES = [
    pytest.param("namespaces", marks=pytest.mark.skipif(not SUPPORT.namespaces, reason=SUPPORT.reason)),
    pytest.param("landlock", marks=pytest.mark.skipif(not SUPPORT.landlock, reason="no Landlock here")),
]
MiB = 1 << 20


def call(tool: PythonTool, code: str) -> str:
    """One call; a ToolError comes back as "ToolError: <message>" so that a test can look at either."""

    async def one() -> str:
        try:
            return await tool.call(tool.parse_arguments({"code": code}), ToolContext())
        except ToolError as error:
            return f"ToolError: {error.message}"

    return asyncio.run(one())


def temp_root(tmp_path: Path) -> Path:
    root = tmp_path / f"calls-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    return root


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hooks", [True, False])
def test_no_file_is_left_on_the_host(tmp_path: Path, mode: str, hooks: bool) -> None:
    root, victim = temp_root(tmp_path), tmp_path / "victim.txt"
    victim.write_text("keep me")
    tool = PythonTool(temp_root=str(root), isolation=mode, audit_hooks=hooks)  # type: ignore[arg-type]
    with SandboxWatch(root, interval=0.05) as watch:  # walking a deep chain takes a while: look less often
        output = call(tool, litter(victim))
    print(f"\n[{mode}, hooks {hooks}] {watch.report()}; {output}; left: {files_beneath(root)}")
    assert output.startswith("built")
    assert files_beneath(root) == []
    assert victim.read_text() == "keep me"
    if mode == "namespaces":  # the snippet's files live on its own tmpfs: the host sees an empty work dir
        assert watch.disk_peak <= 64 * 1024


WRITER = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n    i += 1\n"


@pytest.mark.parametrize("mode", MODES)
def test_writing_past_the_disk_quota_is_stopped(tmp_path: Path, mode: str) -> None:
    root = temp_root(tmp_path)
    tool = PythonTool(temp_root=str(root), isolation=mode, disk_mb=8, max_file_mb=4)  # type: ignore[arg-type]
    with SandboxWatch(root) as watch:
        output = call(tool, WRITER)
    print(f"\n[{mode}] quota 8 MiB: {watch.report()}; {output.splitlines()[0]}")
    assert output.startswith("ToolError: the snippet") and "disk quota" in output
    assert files_beneath(root) == []
    if mode == "namespaces":  # a tmpfs of 8 MiB in the call's own mount namespace: nothing reaches the host
        assert watch.disk_peak <= 64 * 1024
    else:  # the fallback's watch (every 10 ms) stops it late by what it wrote meanwhile: a bound, not a cap
        assert watch.disk_peak <= (8 + 64) * MiB


FORKER = """import os, time
started = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError as error:
        print('fork refused:', error.strerror)
        break
    if pid == 0:
        data = b'x' * (32 << 20)
        time.sleep(1.0)
        os._exit(0)
    started += 1
print('started', started, flush=True)
for _ in range(started):
    os.wait()
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.skipif(  # without a cgroup the caps are per process: see the fallback's own test below
    getattr(SUPPORT, "cgroup", None) == "", reason=f"no cgroup layer here: {getattr(SUPPORT, 'cgroup_reason', '')}"
)
def test_many_children_stay_within_the_memory_and_process_caps(tmp_path: Path, mode: str) -> None:
    """40 forked children of 32 MiB each (1.3 GiB, 41 processes uncapped) under a 128 MiB, 16-task cap."""
    root = temp_root(tmp_path)
    tool = PythonTool(  # the hook refuses os.fork: without it, only the kernel's caps stand
        temp_root=str(root), isolation=mode, audit_hooks=False, memory_mb=128, disk_mb=8, max_processes=16
    )  # type: ignore[arg-type]
    with SandboxWatch(root, interval=0.002) as watch:
        output = call(tool, FORKER)
    print(f"\n[{mode}] caps 136 MiB, 16 tasks ({SUPPORT.cgroup}): {watch.report()}; {output.splitlines()}")
    assert watch.samples > 10
    assert watch.tasks_peak <= 16
    # The cap, plus file pages (the interpreter, its libraries) that Pss counts but the kernel charged elsewhere: how
    # many depends on what else maps them, so the slack is 40 MiB (a fresh-clone CI run measured 162.9 MiB against
    # 160 on 2026-12-05); uncapped, the tree takes 1.3 GiB.
    assert watch.memory_peak <= (128 + 8 + 40) * MiB
    assert files_beneath(root) == []


@pytest.mark.skipif(not SUPPORT.namespaces, reason=SUPPORT.reason)
@pytest.mark.skipif(
    os.geteuid() == 0, reason="root is exempt from RLIMIT_NPROC: a root tool's process cap is the cgroup"
)
@pytest.mark.skipif(
    tuple(map(int, os.uname().release.split(".")[:2])) < (5, 14), reason="RLIMIT_NPROC per user namespace: 5.14+"
)
def test_without_cgroups_the_user_namespace_caps_the_processes(tmp_path: Path) -> None:
    """The fallback: RLIMIT_NPROC, counted in the snippet's own user namespace, and RLIMIT_AS per process."""
    root = temp_root(tmp_path)
    tool = PythonTool(
        temp_root=str(root), isolation="namespaces", audit_hooks=False, cgroups=False, memory_mb=128, max_processes=16
    )
    with SandboxWatch(root, interval=0.002) as watch:
        output = call(tool, FORKER)
    print(f"\n[rlimits] 16 processes, 128 MiB each: {watch.report()}; {output.splitlines()}")
    assert watch.tasks_peak <= 16  # RLIMIT_NPROC 14 in the snippet's namespace, beside the supervisor and init
    assert watch.memory_peak <= 16 * 128 * MiB  # the documented total: the processes times RLIMIT_AS


@pytest.mark.parametrize("mode", MODES)
def test_a_concurrent_call_cannot_see_another_calls_work_dir(tmp_path: Path, mode: str) -> None:
    root, secret = temp_root(tmp_path), uuid.uuid4().hex
    tool = PythonTool(temp_root=str(root), isolation=mode, max_concurrent=2)  # type: ignore[arg-type]
    holder = f"open('secret.txt', 'w').write({secret!r}); print('written', flush=True)\nimport time; time.sleep(2)"

    async def both() -> list[str]:
        async def seek() -> str:
            await asyncio.sleep(0.5)  # the holder has written its secret by now
            return await tool.call(tool.parse_arguments({"code": SEEKER}), ToolContext())

        held = tool.call(tool.parse_arguments({"code": holder}), ToolContext())
        return list(await asyncio.gather(held, seek()))

    held, sought = asyncio.run(both())
    print(f"\n[{mode}] holder: {held!r}; seeker: {sought!r}")
    assert held == "written"
    assert sought == "looked True found []"


def test_the_active_layers_are_reported() -> None:
    support = sandbox_support()
    print(f"\n{support}")
    assert support.cgroup or support.cgroup_reason
    if os.path.isdir("/sys/fs/cgroup") and os.geteuid() == 0 and os.access("/sys/fs/cgroup", os.W_OK):
        assert support.cgroup, support.cgroup_reason


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.skipif(getattr(SUPPORT, "cgroup", None) == "", reason="no cgroup layer here")
def test_the_snippet_cannot_leave_its_cgroups_or_grow_its_tmpfs(tmp_path: Path, mode: str) -> None:
    """With the hook off: moving itself into the parent cgroups, and remounting its tmpfs at 1 GiB, both refused."""
    from agent_env.tools.python import cgroup_places

    parents = [os.path.join(parent, "cgroup.procs") for _, parent in cgroup_places().places.values()]
    tool = PythonTool(temp_root=str(temp_root(tmp_path)), isolation=mode, audit_hooks=False)  # type: ignore[arg-type]
    code = (
        "import ctypes, os\n"
        f"for path in {parents!r}:\n"
        "    try:\n"
        "        open(path, 'w').write(str(os.getpid())); print('moved into', path)\n"
        "    except OSError as error:\n"
        "        print('refused', error.errno)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "flags = 32 | 2 | 4  # MS_REMOUNT | MS_NOSUID | MS_NODEV\n"
        "result = libc.mount(None, os.getcwd().encode(), None, ctypes.c_ulong(flags), b'size=1073741824')\n"
        "print('remount', 'done' if result == 0 else f'refused {ctypes.get_errno()}')\n"
    )
    output = call(tool, code)
    print(f"\n[{mode}] {output!r}")
    assert "moved into" not in output and output.count("refused") == len(parents) + 1
