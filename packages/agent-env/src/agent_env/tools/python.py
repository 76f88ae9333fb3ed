"""The `python` tool: run a snippet in a fresh, limited subprocess and return what it printed.

Each call gets a new temporary working directory (removed afterwards) and a new interpreter,
``sys.executable -I`` (isolated: no PYTHON* variables, no user site), with a small environment (no secrets
from the parent's). A start-up wrapper, passed with ``-c``, applies the limits inside the child before the
snippet runs, so they hold for everything the snippet does:

- CPU time: ``RLIMIT_CPU`` (default 5 s); the kernel stops the process with SIGXCPU -> ``timeout``.
- Memory: ``RLIMIT_AS`` (default 1 GiB of address space); allocations past it fail with MemoryError, or the
  process dies -> ``tool_error`` "memory limit exceeded".
- Wall clock: the parent kills the whole process group (SIGKILL) after `wall_time_s` (default 10 s) ->
  ``timeout``. A process that sleeps uses no CPU, so this limit is the one that stops it.
- Files: ``RLIMIT_FSIZE`` caps a written file (default 16 MiB); an audit hook (`sys.addaudithook`) refuses
  to open for writing, create, remove, rename or chmod anything outside the working directory
  (PermissionError in the snippet). Reading is allowed: the interpreter needs its standard library.
- Network: the audit hook refuses to create Internet sockets and to connect, bind, send to or resolve any
  address; where the kernel allows it the child also moves into an empty network namespace
  (``unshare(CLONE_NEWNET)``, or a user namespace first when not root), which has no route anywhere.
- Escapes: the hook also refuses to start processes (``subprocess``, ``os.system``, ``exec``, ``fork``),
  to signal other processes and to call C functions through ctypes.

Audit hooks are a tripwire, not a sandbox (CPython says as much): code that finds a way around them in the
interpreter itself is not stopped by them. The rlimits, the process group kill and the network namespace are
enforced by the kernel. Run untrusted code from the open internet in a container as well.

Output: stdout, then ``[stderr]`` and stderr if any, then ``[exit code N]`` if non-zero; each stream is cut
at `max_stream_bytes` with a marker. A snippet that raised is not a tool failure: the traceback is the
output. Only POSIX (Linux, macOS) is supported: the limits need the `resource` module.

This module knows processes and limits; it knows nothing about episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Annotated, Any, Final

import msgspec
import structlog

from agent_env.errors import ToolError
from agent_env.schema import convert_arguments, struct_schema
from agent_env.tool import ToolBase, ToolContext

__all__ = ["PythonTool", "PythonToolArguments"]

logger = structlog.get_logger(__name__)

_WRAPPER: Final = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
if not cfg["network"]:
    try:
        os.unshare(os.CLONE_NEWNET)
    except (AttributeError, OSError):
        try:
            uid, gid = os.getuid(), os.getgid()
            os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except (AttributeError, OSError):
            pass
def cap(kind, soft, hard):
    old_soft, old_hard = resource.getrlimit(kind)
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(kind, (soft, hard))
cap(resource.RLIMIT_CPU, cfg["cpu"], cfg["cpu"] + 1)
cap(resource.RLIMIT_AS, cfg["memory"], cfg["memory"])
cap(resource.RLIMIT_FSIZE, cfg["fsize"], cfg["fsize"])
cap(resource.RLIMIT_CORE, 0, 0)
import socket, traceback
root = os.path.realpath(cfg["workdir"])
path = os.path.join(root, "snippet.py")
with open(path, encoding="utf-8") as f:
    code = compile(f.read(), "snippet.py", "exec")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
           "pty.spawn", "ctypes.call_function", "ctypes.dlsym", "signal.pthread_kill", "os.startfile"}
NETWORK = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
           "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
PATHS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
         "os.rename": (0, 1), "os.link": (1,), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,),
         "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1),
         "os.mkfifo": (0,), "os.mknod": (0,)}
def inside(target):
    if isinstance(target, int):
        return True
    resolved = os.path.realpath(os.fsdecode(target))
    return resolved == root or resolved.startswith(root + os.sep) or resolved == os.devnull
def hook(event, args):
    if event == "open":
        target, mode, flags = args
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & WRITE_FLAGS)
        if writing and not inside(target):
            raise PermissionError(f"writing outside the working directory is not allowed: {target}")
    elif event in PATHS:
        for i in PATHS[event]:
            if i < len(args) and args[i] is not None and not inside(args[i]):
                raise PermissionError(f"{event} outside the working directory is not allowed: {args[i]}")
    elif event in BLOCKED:
        raise PermissionError(f"{event} is not allowed in this sandbox")
    elif event == "socket.__new__":
        if not cfg["network"] and len(args) > 1 and args[1] not in (-1, socket.AF_UNIX):
            raise PermissionError("network access is disabled in this sandbox")
    elif event in NETWORK and not cfg["network"]:
        raise PermissionError("network access is disabled in this sandbox")
    elif event in ("os.kill", "os.killpg") and args and args[0] not in (0, os.getpid(), os.getpgid(0)):
        raise PermissionError("signalling other processes is not allowed")
sys.argv = [path]
sys.path.insert(0, root)
sys.dont_write_bytecode = True
namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
sys.addaudithook(hook)
del json, resource, cap
try:
    exec(code, namespace)
except SystemExit:
    raise
except BaseException as error:
    report = part = traceback.TracebackException.from_exception(error)
    while part is not None:  # hide the wrapper's own frames
        part.stack = traceback.StackSummary.from_list([f for f in part.stack if f.filename != "<string>"])
        part = part.__cause__ or part.__context__
    sys.stderr.write("".join(report.format()))
    sys.stderr.flush()
    os._exit(1)
"""


class PythonToolArguments(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    code: Annotated[str, msgspec.Meta(description="Python source to run. Print what you want to see.")]


class PythonTool(ToolBase):
    """Run Python snippets under limits (see the module docstring). Stateless: share one across episodes."""

    def __init__(
        self,
        *,
        name: str = "python",
        cpu_time_s: int = 5,
        wall_time_s: float = 10.0,
        memory_mb: int = 1024,
        max_file_mb: int = 16,
        max_stream_bytes: int = 64_000,
        allow_network: bool = False,
        python: str | None = None,
        temp_root: str | None = None,
    ) -> None:
        if cpu_time_s <= 0 or wall_time_s <= 0 or memory_mb <= 0:
            raise ValueError("cpu_time_s, wall_time_s and memory_mb must be positive")
        self.name = name
        self.description = (
            "Run a Python 3 snippet in a fresh sandboxed process and return its output (stdout, stderr, exit "
            f"code). Limits: {cpu_time_s} s CPU, {wall_time_s:g} s wall clock, {memory_mb} MB memory, no "
            "network, files only in its own temporary directory. Nothing persists between calls."
        )
        self.parameters = struct_schema(PythonToolArguments)
        self.cpu_time_s = cpu_time_s
        self.wall_time_s = wall_time_s
        self.memory_mb = memory_mb
        self.max_file_mb = max_file_mb
        self.max_stream_bytes = max_stream_bytes
        self.allow_network = allow_network
        self.python = python or sys.executable
        self.temp_root = temp_root
        self.timeout_s = wall_time_s + 5.0  # the tool's own wall-clock kill fires first

    def parse_arguments(self, arguments: dict[str, Any]) -> PythonToolArguments:
        return convert_arguments(arguments, PythonToolArguments)

    async def call(self, arguments: PythonToolArguments, context: ToolContext) -> str:
        workdir = tempfile.mkdtemp(prefix="agent-env-python-", dir=self.temp_root)
        try:
            return await self._run(arguments.code, workdir)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def _run(self, code: str, workdir: str) -> str:
        with open(os.path.join(workdir, "snippet.py"), "w", encoding="utf-8") as f:
            f.write(code)
        config = {
            "cpu": self.cpu_time_s,
            "memory": self.memory_mb * 1024 * 1024,
            "fsize": self.max_file_mb * 1024 * 1024,
            "workdir": workdir,
            "network": self.allow_network,
        }
        env = {
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
        process = await asyncio.create_subprocess_exec(
            self.python, "-I", "-B", "-c", _WRAPPER, json.dumps(config),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )  # fmt: skip
        if process.stdout is None or process.stderr is None:  # pragma: no cover - PIPE always gives both
            raise RuntimeError("subprocess pipes are missing")
        readers = (
            asyncio.ensure_future(_read_capped(process.stdout, self.max_stream_bytes)),
            asyncio.ensure_future(_read_capped(process.stderr, self.max_stream_bytes)),
        )
        wall_exceeded = False
        try:
            try:
                await asyncio.wait_for(process.wait(), timeout=self.wall_time_s)
            except TimeoutError:
                wall_exceeded = True
            finally:
                _kill_group(process.pid)  # the snippet's whole session, stragglers included
                await process.wait()
            done, _ = await asyncio.wait(readers, timeout=2.0)
        finally:
            for reader in readers:
                reader.cancel()
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
        if returncode == -signal.SIGXCPU:
            raise ToolError(
                f"the snippet was stopped at the CPU time limit of {self.cpu_time_s} s",
                code="timeout",
                hint="Use a faster algorithm or smaller inputs.",
            )
        last_line = stderr.strip().rsplit("\n", 1)[-1]
        if returncode not in (0, None) and (
            last_line.startswith("MemoryError") or returncode in (-signal.SIGKILL, -signal.SIGSEGV)
        ):
            raise ToolError(
                f"the snippet exceeded the memory limit of {self.memory_mb} MB (exit status {returncode})",
                hint="Use less memory: smaller data, generators instead of lists.",
            )
        return _combine(stdout, stderr, returncode)


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
