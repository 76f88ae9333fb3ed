"""Per-call cgroups for the python tool: a memory cap and a process cap that hold for a snippet's whole tree.

`find_cgroups()` looks, once, for a place beneath this process's own cgroup where it may create children with
the ``memory`` and ``pids`` controllers, each in cgroup v2 (enabled in the parent's ``cgroup.subtree_control``)
or else in a cgroup v1 hierarchy, and proves it by creating and removing a probe child. `CallCgroup` then makes
one child per controller for one call, with ``memory.max`` (v2; swap 0, ``memory.oom.group``) or
``memory.limit_in_bytes`` (v1; memsw the same) and ``pids.max``; the supervisor moves itself in before it forks
anything, so the supervisor, the snippet and every descendant (threads count as pids) share the two caps.
`close()` kills whatever is left in them and removes them.

Where none can be had (no cgroupfs, a read-only or undelegated one), `find_cgroups()` says why and the tool
falls back to per-process rlimits (see `agent_env.tools.python`). This module knows cgroupfs; it knows nothing
about snippets or namespaces.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from typing import Final

import msgspec

__all__ = ["CallCgroup", "CgroupPlaces", "find_cgroups"]

CONTROLLERS: Final = ("memory", "pids")


class CgroupPlaces(msgspec.Struct, frozen=True, kw_only=True):
    """Where a call's cgroups go: controller -> (version "v1"/"v2", the parent directory); `reason` if none."""

    places: dict[str, tuple[str, str]] = {}
    reason: str = ""

    @property
    def layer(self) -> str:
        """ "" when the caps cannot be had, else e.g. "cgroup v1 (memory, pids)"."""
        if set(self.places) != set(CONTROLLERS):
            return ""
        versions = sorted({version for version, _ in self.places.values()})
        return f"cgroup {'+'.join(versions)} (memory, pids)"


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _beneath(point: str, root: str, path: str) -> str | None:
    """The directory of cgroup `path` in a hierarchy whose `root` is mounted at `point` (None: not in it)."""
    relative = os.path.relpath(path, root)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return None
    return point if relative == os.curdir else os.path.join(point, relative)


def _candidates() -> dict[str, list[tuple[str, str]]]:
    """controller -> [(version, directory of this process's own cgroup)], v2 first."""
    own: dict[str, str] = {}  # "" for the v2 hierarchy, else each v1 controller
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    found: dict[str, list[tuple[str, str]]] = {controller: [] for controller in CONTROLLERS}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            separator = fields.index("-")
            fstype, options = fields[separator + 1], fields[separator + 3].split(",")
            root, point = _unescape(fields[3]), _unescape(fields[4])
            if fstype == "cgroup2" and "" in own and (mine := _beneath(point, root, own[""])):
                with contextlib.suppress(OSError), open(os.path.join(mine, "cgroup.subtree_control")) as g:
                    enabled = g.read().split()
                    for controller in CONTROLLERS:
                        if controller in enabled:
                            found[controller].insert(0, ("v2", mine))
            elif fstype == "cgroup":
                for controller in CONTROLLERS:
                    if controller in options and controller in own and (mine := _beneath(point, root, own[controller])):
                        found[controller].append(("v1", mine))
    return found


def _limit(version: str, controller: str, directory: str, value: int) -> None:
    """Write the cap `value` (bytes or tasks) into the cgroup `directory`."""

    def write(name: str, text: str, *, optional: bool = False) -> None:
        try:
            with open(os.path.join(directory, name), "w") as f:
                f.write(text)
        except FileNotFoundError:
            if not optional:
                raise

    if controller == "pids":
        write("pids.max", str(value))
    elif version == "v2":
        write("memory.max", str(value))
        write("memory.swap.max", "0", optional=True)
        write("memory.oom.group", "1", optional=True)
    else:
        write("memory.limit_in_bytes", str(value))
        write("memory.memsw.limit_in_bytes", str(value), optional=True)  # no swap beyond the cap


def find_cgroups() -> CgroupPlaces:
    """Find, by creating a probe child with both caps set, where per-call cgroups can go. Never raises."""
    if not os.path.isfile("/proc/self/cgroup"):
        return CgroupPlaces(reason="no /proc/self/cgroup (not Linux)")
    try:
        candidates = _candidates()
    except (OSError, ValueError, IndexError) as error:
        return CgroupPlaces(reason=f"cannot read this process's cgroups: {error}")
    places: dict[str, tuple[str, str]] = {}
    reasons = []
    for controller, options in candidates.items():
        for version, parent in options:
            probe = os.path.join(parent, f"agent-env-call-probe-{uuid.uuid4().hex}")
            try:
                os.mkdir(probe)
                try:
                    _limit(version, controller, probe, 64 if controller == "pids" else 1 << 30)
                finally:
                    os.rmdir(probe)
            except OSError as error:
                reasons.append(f"{controller} ({version}, {parent}): {error.strerror or error}")
                continue
            places[controller] = (version, parent)
            break
        else:
            reasons.append(f"{controller}: no writable hierarchy" if not options else "")
    missing = [c for c in CONTROLLERS if c not in places]
    reason = f"no cgroup for {', '.join(missing)}: " + "; ".join(r for r in reasons if r) if missing else ""
    return CgroupPlaces(places=places, reason=reason)


class CallCgroup:
    """One call's cgroups (one per controller), created capped; `close()` empties and removes them."""

    def __init__(self, places: CgroupPlaces, *, memory: int, processes: int) -> None:
        name = f"agent-env-call-{uuid.uuid4().hex}"
        self.directories: list[tuple[str, str]] = []  # (version, directory)
        try:
            for controller, (version, parent) in places.places.items():
                directory = os.path.join(parent, name)
                os.mkdir(directory)
                self.directories.append((version, directory))
                _limit(version, controller, directory, processes if controller == "pids" else memory)
        except OSError:
            self.close()
            raise

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(directory, "cgroup.procs") for _, directory in self.directories]

    def close(self) -> None:
        """Kill every process still in the call's cgroups, then remove them (retrying while they die)."""
        deadline = time.monotonic() + 5.0
        for _, directory in reversed(self.directories):
            with contextlib.suppress(OSError), open(os.path.join(directory, "cgroup.kill"), "w") as f:
                f.write("1")  # v2 (Linux 5.14+): the kernel kills the whole cgroup at once
            while True:
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: processes left, or still dying
                    if time.monotonic() > deadline:
                        raise
                with contextlib.suppress(OSError), open(os.path.join(directory, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.005)
        self.directories = []
