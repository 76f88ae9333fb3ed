"""Watching python-tool calls from outside: the host disk beneath a temp root, and the process trees of its calls.

`SandboxWatch(temp_root)` samples, on a thread, every `interval` s while it is open: the bytes allocated beneath
`temp_root` (walked by directory fd, so deep chains count), and, for every call whose supervisor's command line
names `temp_root`, the supervisor's whole process tree (its descendants in the host's /proc): the number of
tasks (threads count, as in the pids cgroup) and the sum of their proportional set sizes (Pss, so pages forked
children share are counted once). It keeps the peaks. It trusts nothing a snippet prints.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from pathlib import Path
from types import TracebackType

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def allocated_beneath(root: Path) -> int:
    """Bytes allocated to files beneath `root`, one directory fd open at a time (no recursion, no long paths)."""
    total = 0
    try:
        fd = os.open(root, _DIRECTORY)
    except OSError:
        return 0
    frames: list[list[str]] = []

    def listing() -> list[str]:
        nonlocal total
        subdirectories = []
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        subdirectories.append(entry.name)
        return subdirectories

    frames.append(listing())
    try:
        while frames:
            if not frames[-1]:
                frames.pop()
                if frames:
                    parent = os.open("..", _DIRECTORY, dir_fd=fd)
                    os.close(fd)
                    fd = parent
                continue
            try:
                child = os.open(frames[-1].pop(), _DIRECTORY, dir_fd=fd)
            except OSError:
                continue
            os.close(fd)
            fd = child
            frames.append(listing())
    finally:
        os.close(fd)
    return total


def files_beneath(root: Path) -> list[str]:
    """Everything left beneath `root` (names only, first levels), for a failure message."""
    with contextlib.suppress(OSError):
        return sorted(os.listdir(root))
    return []


def _parents() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    return children


def _pss(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _tasks(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/task"))
    return 0


def trees(temp_root: Path) -> tuple[int, int]:
    """(tasks, bytes of Pss) of every process tree whose root is a supervisor of a call under `temp_root`."""
    marker = str(temp_root).encode()
    roots = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if b"_sandbox_supervisor.py" in cmdline and marker in cmdline:
                    roots.append(int(entry))
    children = _parents()
    members, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid not in members:
            members.add(pid)
            stack += children.get(pid, [])
    return sum(_tasks(pid) for pid in members), sum(_pss(pid) for pid in members)


class SandboxWatch:
    """Peaks of host disk use beneath `temp_root` and of the calls' process trees while open (a context manager)."""

    def __init__(self, temp_root: Path, *, interval: float = 0.005) -> None:
        self.temp_root = temp_root
        self.interval = interval
        self.disk_peak = 0
        self.tasks_peak = 0
        self.memory_peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.disk_peak = max(self.disk_peak, allocated_beneath(self.temp_root))
            tasks, memory = trees(self.temp_root)
            self.tasks_peak, self.memory_peak = max(self.tasks_peak, tasks), max(self.memory_peak, memory)
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self) -> SandboxWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> str:
        return (
            f"host disk peak {self.disk_peak / 2**20:.1f} MiB, tree peak {self.memory_peak / 2**20:.1f} MiB Pss "
            f"in {self.tasks_peak} tasks ({self.samples} samples)"
        )
