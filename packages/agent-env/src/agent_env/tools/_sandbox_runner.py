"""The python tool's runner: the audit-hook tripwire, then the snippet. Loaded by `_sandbox_supervisor.py`.

`main(config)` runs in the snippet's process once the supervisor has built the kernel layers around it (or
``python -I -B _sandbox_runner.py CONFIG_JSON`` for a look without them); never imported by agent_env. With
``audit_hooks`` on it installs `sys.addaudithook` refusing (PermissionError, "not allowed") what the snippet
should not do: write, create, remove, rename, link, chmod or chown outside the work dir (resolving ``dir_fd``
and file descriptors), open sqlite databases or ATTACH files outside it, start processes by any audited route
(and `_posixsubprocess.fork_exec`, which raises no audit event, is replaced), import `_posixsubprocess`
afresh, signal other processes, call C through ctypes, and use the network when it is off. ``os.open``,
``os.mkfifo`` and ``os.mknod`` are wrapped because their audit events lack ``dir_fd`` (or are missing).

This is a tripwire for honest mistakes and a clear message for the model, not the boundary: CPython's audit
hooks can be bypassed by code that reaches the interpreter's internals. The boundary is the kernel's
(read-only mounts, Landlock, namespaces). The runner knows the snippet's file; it knows nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, Final

WRITE_FLAGS: Final = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED: Final = {
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "pty.spawn", "ctypes.call_function", "ctypes.dlsym", "signal.pthread_kill", "os.startfile",
}  # fmt: skip
NETWORK: Final = {
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
}  # fmt: skip
# event -> ((index of a path argument, index of its dir_fd argument or None), ...)
PATHS: Final[dict[str, tuple[tuple[int, int | None], ...]]] = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.truncate": ((0, None),),
    "os.utime": ((0, 3),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "os.chflags": ((0, None),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.copytree": ((1, None),),
    "shutil.move": ((0, None), (1, None)), "shutil.chown": ((0, None),), "shutil.copymode": ((1, None),),
    "shutil.copystat": ((1, None),), "shutil.make_archive": ((0, None),), "shutil.unpack_archive": ((1, None),),
}  # fmt: skip
SQLITE_ATTACH, SQLITE_OK, SQLITE_DENY = 24, 0, 1
OWN_FILES: Final = {__file__, os.path.join(os.path.dirname(__file__), "_sandbox_supervisor.py")}


class Guard:
    """Where the snippet may write: beneath `root`, /dev/null, and file descriptors that are not paths."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    def _fd_path(self, fd: int) -> str | None:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None

    def inside(self, target: Any, dir_fd: int | None = None) -> bool:
        if isinstance(target, int):
            path = self._fd_path(target)
            return path is not None and (not path.startswith("/") or self.inside(path))
        path = os.fsdecode(target)
        if dir_fd is not None and dir_fd >= 0 and not os.path.isabs(path):
            base = self._fd_path(dir_fd)
            if base is None:
                return False
            path = os.path.join(base, path)
        resolved = os.path.realpath(path)
        return resolved == self.root or resolved.startswith(self.root + os.sep) or resolved == os.devnull

    def require(self, what: str, target: Any, dir_fd: int | None = None) -> None:
        if not self.inside(target, dir_fd):
            raise PermissionError(f"{what} outside the working directory is not allowed: {target}")

    def sqlite_inside(self, database: Any) -> bool:
        name = os.fsdecode(database) if isinstance(database, str | bytes | os.PathLike) else ""
        if name in ("", ":memory:") or (name.startswith("file:") and "mode=memory" in name):
            return True
        return not name.startswith("file:") and self.inside(name)


def _refuse(name: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(f"{name} is not allowed in this sandbox")

    return refused


def install(guard: Guard, network: bool) -> None:
    """Wrap what the audit events cannot see, then add the hook. Nothing here can be removed later."""
    import _posixsubprocess
    import socket

    _posixsubprocess.fork_exec = _refuse("_posixsubprocess.fork_exec")
    real_open, real_mkfifo, real_mknod = os.open, os.mkfifo, os.mknod

    def guarded_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & WRITE_FLAGS:
            guard.require("writing", path, dir_fd)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    def guarded_mkfifo(path: Any, mode: int = 0o666, *, dir_fd: int | None = None) -> None:
        guard.require("os.mkfifo", path, dir_fd)
        real_mkfifo(path, mode, dir_fd=dir_fd)

    def guarded_mknod(path: Any, mode: int = 0o600, device: int = 0, *, dir_fd: int | None = None) -> None:
        guard.require("os.mknod", path, dir_fd)
        real_mknod(path, mode, device, dir_fd=dir_fd)

    import posix

    for module in (os, posix):
        for name, guarded in (("open", guarded_open), ("mkfifo", guarded_mkfifo), ("mknod", guarded_mknod)):
            setattr(module, name, guarded)

    def authorize(action: int, first: Any, *_: Any) -> int:
        return SQLITE_DENY if action == SQLITE_ATTACH and not guard.sqlite_inside(first or "") else SQLITE_OK

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            target, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and bool(flags & WRITE_FLAGS)
            )
            if writing and not isinstance(target, int):
                guard.require("writing", target)
        elif event in PATHS:
            for index, fd_index in PATHS[event]:
                if index < len(args) and args[index] is not None:
                    dir_fd = args[fd_index] if fd_index is not None and fd_index < len(args) else None
                    guard.require(event, args[index], dir_fd)
        elif event == "os.symlink":
            link, dir_fd = args[1], args[2] if len(args) > 2 else None
            guard.require(event, link, dir_fd)
            base = os.path.dirname(os.fsdecode(link)) or "."
            guard.require(event, os.path.join(base, os.fsdecode(args[0])), dir_fd)
        elif event == "sqlite3.connect" and not guard.sqlite_inside(args[0]):
            raise PermissionError(f"sqlite3 outside the working directory is not allowed: {args[0]}")
        elif event == "sqlite3.connect/handle":
            args[0].set_authorizer(authorize)
        elif event == "import" and args[0] == "_posixsubprocess":
            raise PermissionError("importing _posixsubprocess again is not allowed in this sandbox")
        elif event in BLOCKED:
            raise PermissionError(f"{event} is not allowed in this sandbox")
        elif event == "socket.__new__":
            if not network and len(args) > 1 and args[1] not in (-1, socket.AF_UNIX):
                raise PermissionError("network access is disabled in this sandbox")
        elif event in NETWORK and not network:
            raise PermissionError("network access is disabled in this sandbox")
        elif event in ("os.kill", "os.killpg") and args and args[0] not in (0, os.getpid(), os.getpgid(0)):
            raise PermissionError("signalling other processes is not allowed")

    sys.addaudithook(hook)


def main(cfg: dict[str, Any]) -> None:
    """Run the snippet under `cfg` (workdir, network, audit_hooks); its exceptions become its stderr."""
    guard = Guard(cfg["workdir"])
    path = os.path.join(guard.root, "snippet.py")
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), "snippet.py", "exec")
    sys.argv = [path]
    sys.path[0] = guard.root
    sys.dont_write_bytecode = True
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    if cfg["audit_hooks"]:
        install(guard, cfg["network"])
    try:
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as error:  # the traceback is the snippet's output
        report = traceback.TracebackException.from_exception(error)
        part: traceback.TracebackException | None = report
        while part is not None:  # hide the runner's own frames
            part.stack = traceback.StackSummary.from_list([f for f in part.stack if f.filename not in OWN_FILES])
            part = part.__cause__ or part.__context__
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stderr.write("".join(report.format()))
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
