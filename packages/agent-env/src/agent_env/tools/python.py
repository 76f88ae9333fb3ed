"""The `python` tool: run a snippet in a fresh sandboxed process and return what it printed.

Each call gets a new working directory and a new interpreter, ``sys.executable -I -B`` (isolated: no PYTHON*
variables, no user site), with a small environment (no secrets from the parent's), started as
`_sandbox_supervisor.py` with the snippet's source on stdin; the supervisor builds the sandbox and then runs
the snippet (through `_sandbox_runner.py`) in a forked child. At most `max_concurrent` sandboxes run at once
per tool (default: the CPU count); other calls wait for a slot.

What the sandbox rests on, layer by layer (`sandbox_support()` says which this machine has):

1. Linux namespaces, where ``unshare`` is allowed (root or not: a user namespace maps only the caller's own
   uid): a mount namespace in which every mount is read-only, nosuid and nodev, except the work dir, which is
   a fresh tmpfs of `disk_mb` (and ``disk_mb * 256`` inodes) mounted there: the snippet's files never reach
   the host's disk, vanish with the namespace, and other calls' work dirs (each its own tmpfs) are not there
   to see; /dev/null, zero, full, random, urandom stay usable. A fresh PID namespace whose init exits when
   the snippet does, so the kernel kills every process the snippet left (``setsid`` and double forks
   included); a fresh read-only /proc; an empty network namespace when the network is off. The snippet runs
   in a second user namespace as a non-root uid with no capabilities, so it cannot remount anything
   writable; ``RLIMIT_NPROC`` there counts its own tree (Linux 5.14+; `max_processes` - 2; a root tool is exempt).
2. Per-call cgroups (`_sandbox_cgroup.py`), where this process may create children with the ``memory`` and
   ``pids`` controllers (cgroup v2, or v1 hierarchies): ``memory_mb + disk_mb`` (tmpfs pages are charged
   there too; no swap) and `max_processes` tasks for the supervisor, the snippet and every descendant. The
   kernel OOM-kills inside the group (-> ``tool_error`` "memory limit") and refuses forks past the cap
   (-> ``tool_error`` "process cap").
3. Landlock, where the kernel has it (Linux 5.13+): writes, creations, removals, renames and links only
   beneath the work dir (and writes to /dev/null), by any route (``fork_exec``, sqlite, ``dir_fd``, links,
   /proc/<pid>/root); TCP bind/connect refused when the network is off (Landlock ABI 4+); signals and
   abstract unix sockets scoped to the sandbox (ABI 6+). Without namespaces it also refuses reads in the
   work dir's siblings (other calls' work dirs) and in the directories above it.
4. Without namespaces: the supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``) and, when the
   snippet ends or the wall clock fires, SIGKILLs its whole remaining process tree through pidfds; the work
   dir is on the host's disk, and the supervisor walks it every 10 ms and kills the tree past `disk_mb`.
5. Always: rlimits (CPU ``RLIMIT_CPU`` default 5 s -> ``timeout``; address space ``RLIMIT_AS`` default 1 GiB
   per process -> ``tool_error`` "memory limit"; file size ``RLIMIT_FSIZE`` 16 MiB; no core),
   ``PR_SET_NO_NEW_PRIVS``, an empty capability bounding set, the wall clock (`wall_time_s`, default 10 s ->
   ``timeout``), and an audit hook tripwire (`_sandbox_runner.py`) that refuses writes outside the work dir,
   process creation (including ``_posixsubprocess.fork_exec``), signals to other processes, ctypes calls and
   the network with a clear PermissionError for the model. Afterwards the work dir is removed by
   `_sandbox_cleanup.remove_tree` (directory fds, no recursion, modes set back), which no snippet defeats.

"auto" `isolation` uses every layer the kernel offers; "namespaces" or "landlock" force one (an error where it
is missing); ``cgroups=False`` leaves the cgroup layer out. The call returns when the snippet's main process
ends, even if a child still holds its stdout: the supervisor kills that child first. A snippet that ends on a
full disk (ENOSPC, EFBIG) or on the watch's quota is a ``tool_error`` naming the quota.

What it does not promise: audit hooks alone are a tripwire, not a boundary (CPython says as much), so a host
with neither namespaces nor Landlock (macOS, a container that forbids both) has only the hook, rlimits and the
process-group kill, and a descendant that calls ``setsid`` can outlive the call on macOS. Landlock has no
right for chmod/chown/utime: without namespaces those rest on the hook and on the tool's uid. Without
namespaces the disk quota is a watch, not a cap (the snippet writes on until the next look). Without a cgroup,
memory is per process (``max_processes * memory_mb`` in all under the namespaces' RLIMIT_NPROC), and without
namespaces and cgroups there is no process cap. With namespaces, reading is allowed everywhere the tool's own
uid can read (the interpreter needs its standard library; do not keep secrets readable by it), and named unix
sockets of the host (/run/...) are not hidden. Kernel bugs are out of scope. Run untrusted code from the open
internet in a VM or a hardened container as well.

Output: stdout, then ``[stderr]`` and stderr if any, then ``[exit code N]`` if non-zero; each stream is cut
at `max_stream_bytes` with a marker. A snippet that raised is not a tool failure: the traceback is the
output. Only POSIX (Linux, macOS) is supported: the limits need the `resource` module.

This module knows processes and limits; it knows nothing about episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import structlog

from agent_env.errors import ToolError
from agent_env.tool import EventLoopMode, ToolBase, ToolContext
from agent_env.tools._sandbox_cgroup import CallCgroup, CgroupPlaces, find_cgroups
from agent_env.tools._sandbox_cleanup import remove_tree

__all__ = ["PythonTool", "PythonToolArguments", "SandboxSupport", "default_max_concurrent", "sandbox_support"]

logger = structlog.get_logger(__name__)

_HERE: Final = Path(__file__).resolve().parent
_SUPERVISOR: Final = str(_HERE / "_sandbox_supervisor.py")
_SETUP_FAILED: Final = 125  # the supervisor's exit code when a sandbox layer could not be built
_QUOTA_EXCEEDED: Final = 126  # the supervisor's exit code when its watch (no namespaces) stopped the snippet
_FULL_DISK: Final = ("[Errno 28]", "[Errno 27]", "[Errno 122]")  # ENOSPC, EFBIG, EDQUOT in a traceback's last line
_NO_PROCESS: Final = "[Errno 11]"  # EAGAIN from fork: the process cap
Isolation = Literal["auto", "namespaces", "landlock"]


class SandboxSupport(msgspec.Struct, frozen=True, kw_only=True):
    """What this machine's kernel lets the sandbox use, found by trying it (`sandbox_support`)."""

    namespaces: bool
    landlock: bool
    reason: str = ""
    cgroup: str = ""  # e.g. "cgroup v1 (memory, pids)": the tree-wide caps; "" when only rlimits hold
    cgroup_reason: str = ""  # why there is no cgroup layer


@functools.cache
def sandbox_support(python: str | None = None) -> SandboxSupport:
    """Try the namespace sandbox for real (a one-line snippet) and ask the kernel for Landlock. Cached."""
    python = python or sys.executable
    reason = ""
    namespaces = False
    if sys.platform.startswith("linux"):
        with tempfile.TemporaryDirectory(prefix="agent-env-python-probe-") as workdir:
            config = _config(workdir, cpu=5, memory=1 << 30, fsize=1 << 20, network=False, namespaces=True)
            config.update(disk=1 << 20, inodes=64, processes=64, cgroups=[], landlock=False, audit_hooks=False)
            try:
                probe = subprocess.run(
                    [python, "-I", "-B", _SUPERVISOR, json.dumps(config)], input="print('ok')",
                    capture_output=True, text=True, timeout=30, cwd=workdir, env=_environment(workdir),
                )  # fmt: skip
                namespaces = probe.returncode == 0 and probe.stdout == "ok\n"
                reason = "" if namespaces else (probe.stderr.strip().splitlines() or ["no output"])[-1]
            except (OSError, subprocess.SubprocessError) as error:
                reason = str(error)
    else:
        reason = f"namespaces are Linux-only ({sys.platform})"
    landlock = False
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        abi = subprocess.run([python, "-I", "-B", _SUPERVISOR, "--landlock-abi"], capture_output=True, timeout=30)
        landlock = int(abi.stdout or 0) > 0
    if not namespaces:
        logger.warning("python_sandbox_without_namespaces", reason=reason, landlock=landlock)
    places = cgroup_places()
    if not places.layer:
        logger.warning("python_sandbox_without_cgroups", reason=places.reason)
    return SandboxSupport(
        namespaces=namespaces, landlock=landlock, reason=reason, cgroup=places.layer, cgroup_reason=places.reason
    )


@functools.cache
def cgroup_places() -> CgroupPlaces:
    """Where this process may create per-call cgroups (found once, by trying)."""
    return find_cgroups()


def default_max_concurrent() -> int:
    """One sandbox per CPU this process may use (at least 1)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


class PythonToolArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    code: Annotated[str, msgspec.Meta(description="Python source to run. Print what you want to see.")]


class PythonTool(ToolBase):
    """Run Python snippets in a sandbox (see the module docstring). Stateless: share one across episodes.

    `max_concurrent` caps the sandboxes this instance runs at once (default: the CPU count); further calls
    wait for a slot, and the wait counts toward the tool's `timeout_s`. `isolation` picks the kernel
    layers: "auto" (every one the kernel allows), "namespaces" or "landlock" (that one alone, an error where
    it is missing: for tests and for hosts that must not silently run with less). `audit_hooks=False` drops
    the tripwire, to prove the kernel layers hold on their own; never turn it off for a model.

    It runs on the caller's event loop (``event_loop = "shared"``): it only awaits a subprocess, never blocks,
    and its concurrency cap is a semaphore per loop, which a fresh loop per call would make useless.
    """

    event_loop: EventLoopMode = "shared"
    arguments_type = PythonToolArguments

    def __init__(
        self,
        *,
        name: str = "python",
        cpu_time_s: int = 5,
        wall_time_s: float = 10.0,
        memory_mb: int = 1024,
        max_file_mb: int = 16,
        disk_mb: int = 64,
        max_processes: int = 64,
        max_stream_bytes: int = 64_000,
        allow_network: bool = False,
        python: str | None = None,
        temp_root: str | None = None,
        max_concurrent: int | None = None,
        isolation: Isolation = "auto",
        audit_hooks: bool = True,
        cgroups: bool = True,
    ) -> None:
        if min(cpu_time_s, wall_time_s, memory_mb, max_file_mb, disk_mb) <= 0:
            raise ValueError("cpu_time_s, wall_time_s, memory_mb, max_file_mb and disk_mb must be positive")
        if max_processes < 4:  # the supervisor, the namespace's init and the snippet count too
            raise ValueError(f"max_processes must be at least 4, got {max_processes}")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        if isolation not in ("auto", "namespaces", "landlock"):
            raise ValueError(f"isolation must be 'auto', 'namespaces' or 'landlock', got {isolation!r}")
        self.name = name
        self.description = (
            "Run a Python 3 snippet in a fresh sandboxed process and return its output (stdout, stderr, exit "
            f"code). Limits: {cpu_time_s} s CPU, {wall_time_s:g} s wall clock, {memory_mb} MB memory, "
            f"{max_processes} processes, no network, files only in its own temporary directory ({disk_mb} MB). "
            "Nothing persists between calls."
        )
        self.cpu_time_s = cpu_time_s
        self.wall_time_s = wall_time_s
        self.memory_mb = memory_mb
        self.max_file_mb = max_file_mb
        self.disk_mb = disk_mb
        self.max_processes = max_processes
        self.max_stream_bytes = max_stream_bytes
        self.allow_network = allow_network
        self.python = python or sys.executable
        self.temp_root = temp_root
        self.max_concurrent = max_concurrent or default_max_concurrent()
        self.isolation: Isolation = isolation
        self.audit_hooks = audit_hooks
        self.cgroups = cgroups
        self.timeout_s = wall_time_s + 5.0  # the tool's own wall-clock kill fires first
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    async def call(self, arguments: PythonToolArguments, context: ToolContext) -> str:
        namespaces, landlock = await self._layers()
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.max_concurrent))
        async with slots:
            workdir = tempfile.mkdtemp(prefix="agent-env-python-", dir=self.temp_root)
            cgroup = None
            try:
                if self.cgroups and (places := cgroup_places()).layer:
                    cgroup = await self._cgroup(places)
                return await self._run(arguments.code, workdir, namespaces, landlock, cgroup)
            finally:
                await asyncio.to_thread(_clean_up, workdir, cgroup)

    async def _cgroup(self, places: CgroupPlaces) -> CallCgroup:
        """The call's cgroups: the tree's memory (its tmpfs files count there too) and its tasks."""
        memory = (self.memory_mb + self.disk_mb) << 20
        try:
            return await asyncio.to_thread(CallCgroup, places, memory=memory, processes=self.max_processes)
        except OSError as error:
            logger.error("python_sandbox_cgroup_failed", error=str(error))
            raise ToolError(f"the python sandbox could not be set up: its cgroup: {error}") from error

    async def _layers(self) -> tuple[bool, bool]:
        """(namespaces, landlock) for this call, or a ToolError when the forced layer is missing."""
        support = await asyncio.to_thread(sandbox_support, self.python)
        if self.isolation == "namespaces" and not support.namespaces:
            raise ToolError(f"the namespace sandbox is not available here: {support.reason}")
        if self.isolation == "landlock" and not support.landlock:
            raise ToolError("the Landlock sandbox is not available here (Linux 5.13+ with Landlock enabled)")
        return support.namespaces and self.isolation != "landlock", self.isolation != "namespaces"

    async def _run(self, code: str, workdir: str, namespaces: bool, landlock: bool, cgroup: CallCgroup | None) -> str:
        config = _config(
            workdir,
            cpu=self.cpu_time_s,
            memory=self.memory_mb * 1024 * 1024,
            fsize=self.max_file_mb * 1024 * 1024,
            network=self.allow_network,
            namespaces=namespaces,
        )
        disk = self.disk_mb << 20
        config.update(
            disk=disk, inodes=max(1024, disk // 4096), processes=self.max_processes,
            cgroups=cgroup.procs_files if cgroup else [], landlock=landlock, audit_hooks=self.audit_hooks,
        )  # fmt: skip
        source = code.encode("utf-8", errors="replace")  # before the process: nothing may fail between
        process = await asyncio.create_subprocess_exec(
            self.python, "-I", "-B", _SUPERVISOR, json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=_environment(workdir),
            start_new_session=True,
        )  # fmt: skip
        if process.stdin is None or process.stdout is None or process.stderr is None:  # pragma: no cover
            raise RuntimeError("subprocess pipes are missing")
        process.stdin.write(source)  # the supervisor reads it all first
        process.stdin.close()
        readers = (
            asyncio.ensure_future(_read_capped(process.stdout, self.max_stream_bytes)),
            asyncio.ensure_future(_read_capped(process.stderr, self.max_stream_bytes)),
        )
        wall_exceeded = False
        try:
            # the supervisor exits when the snippet does, after killing whatever the snippet started: wait for
            # that exit itself, not for the pipes to close (a straggler could hold them)
            wall_exceeded = not await _exited(process, self.wall_time_s)
            if wall_exceeded:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGUSR1)  # the supervisor kills the snippet's whole tree
            done, _ = await asyncio.wait(readers, timeout=2.0)
        finally:
            if process.returncode is None:  # cancelled from outside: stop the snippet's tree the same way
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGUSR1)
            if not await _exited(process, 2.0):
                _kill_group(process.pid)  # last resort: the supervisor itself did not stop
            for reader in readers:
                reader.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), timeout=1.0)
        stdout = readers[0].result() if readers[0] in done else ""
        stderr = readers[1].result() if readers[1] in done else ""
        return self._report(process.returncode, stdout, stderr, wall_exceeded)

    def _report(self, returncode: int | None, stdout: str, stderr: str, wall_exceeded: bool) -> str:
        if wall_exceeded:
            raise ToolError(
                f"the snippet was stopped at the wall-clock limit of {self.wall_time_s:g} s",
                code="timeout",
                hint="Make it finish sooner (no sleeping, no waiting for input). Output before the stop:\n"
                + _combine(stdout, stderr, None)[:1000],
            )
        if returncode == _SETUP_FAILED and stderr.startswith("sandbox setup failed:"):
            logger.error("python_sandbox_setup_failed", stderr=stderr[:500])
            raise ToolError(
                "the python sandbox could not be set up: " + stderr.strip()[len("sandbox setup failed: ") :]
            )
        if returncode == _QUOTA_EXCEEDED and stderr.rstrip().endswith("sandbox: the work dir passed its disk quota"):
            raise ToolError(
                f"the snippet's files passed the disk quota of {self.disk_mb} MB and it was stopped",
                hint="Write less: smaller files, fewer of them.",
            )
        if returncode == -signal.SIGXCPU:
            raise ToolError(
                f"the snippet was stopped at the CPU time limit of {self.cpu_time_s} s",
                code="timeout",
                hint="Use a faster algorithm or smaller inputs.",
            )
        last_line = stderr.strip().rsplit("\n", 1)[-1]
        if returncode not in (0, None) and "Error: [Errno " in last_line:  # an uncaught OSError ended it
            if any(errno in last_line for errno in _FULL_DISK):
                raise ToolError(
                    f"the snippet ran out of its disk quota ({self.disk_mb} MB in all, {self.max_file_mb} MB a "
                    f"file): {last_line}",
                    hint="Write less: smaller files, fewer of them. Output before the stop:\n"
                    + _combine(stdout, "", None)[:1000],
                )
            if last_line.startswith("BlockingIOError") and _NO_PROCESS in last_line:
                raise ToolError(
                    f"the snippet passed the cap of {self.max_processes} processes (threads count): {last_line}",
                    hint="Start fewer processes or threads.",
                )
        if returncode not in (0, None) and (
            last_line.startswith("MemoryError") or returncode in (-signal.SIGKILL, -signal.SIGSEGV)
        ):
            raise ToolError(
                f"the snippet exceeded the memory limit of {self.memory_mb} MB (exit status {returncode})",
                hint="Use less memory: smaller data, generators instead of lists.",
            )
        return _combine(stdout, stderr, returncode)


def _clean_up(workdir: str, cgroup: CallCgroup | None) -> None:
    """After a call: kill what is left in its cgroups and remove them, then remove its work dir, whatever is in it."""
    if cgroup is not None:
        try:
            cgroup.close()
        except OSError as error:  # the call's result stands; what is left is the operator's to see
            logger.error("python_cgroup_not_removed", cgroups=cgroup.directories, error=str(error))
    try:
        remove_tree(workdir)
    except OSError as error:  # only what even the tree's owner cannot remove (a mount point, chattr +i)
        logger.error("python_work_dir_not_removed", workdir=workdir, error=str(error))


def _config(workdir: str, *, cpu: int, memory: int, fsize: int, network: bool, namespaces: bool) -> dict[str, Any]:
    return {
        "workdir": os.path.realpath(workdir), "cpu": cpu, "memory": memory, "fsize": fsize,
        "network": network, "namespaces": namespaces,
    }  # fmt: skip


def _environment(workdir: str) -> dict[str, str]:
    """The whole environment a snippet sees: nothing of the parent's (no secrets)."""
    return {
        "HOME": workdir,
        "TMPDIR": workdir,
        "PATH": os.defpath,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


async def _exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether the process exits within `timeout` s. Unlike `process.wait()`, this ignores open pipes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = 0.002
    while process.returncode is None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> str:
    """Read a stream to its end, keeping the first `limit` bytes and counting the rest."""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    text = kept.decode("utf-8", errors="replace")
    return text + (f"\n[... {dropped} more bytes not shown]" if dropped else "")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _combine(stdout: str, stderr: str, returncode: int | None) -> str:
    parts = [stdout.rstrip("\n")] if stdout.strip() else []
    if stderr.strip():
        parts.append("[stderr]\n" + stderr.rstrip("\n"))
    if returncode not in (0, None):
        parts.append(f"[exit code {returncode}]")
    return "\n".join(parts) if parts else "(no output)"
