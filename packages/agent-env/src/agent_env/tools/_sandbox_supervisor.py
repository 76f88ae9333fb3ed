"""The python tool's supervisor: a script that builds the sandbox's kernel layers and outlives nothing it starts.

Run as ``python -I -B _sandbox_supervisor.py CONFIG_JSON`` (the snippet's source on stdin) by
`agent_env.tools.python`; never imported by agent_env (it must start with nothing but the standard library).
What it does, in order:

0. Joins the call's cgroups (``cgroups``: their ``cgroup.procs`` files, made by the tool) before it forks
   anything, so its whole tree shares their memory and pids caps; reads the source; the snippet's stdin is
   /dev/null.
1. Namespaces (``isolation`` "auto" or "namespaces"): ``unshare`` a user namespace that maps only our own
   uid/gid, a mount namespace, a PID namespace and (network off) an empty network namespace. In the mount
   namespace a fresh tmpfs (``disk`` bytes, ``inodes`` inodes, nosuid, nodev) is mounted on the work dir and
   the source written there as snippet.py; every other mount is remounted read-only, nosuid and nodev;
   /dev/null, zero, full, random, urandom are bound back without nodev. The process forked next is PID 1 of
   the new PID namespace: it mounts a fresh read-only /proc (so /proc/<host pid>/root cannot lead back to the
   host's writable mounts), starts the snippet and exits when the snippet does, and the kernel then kills
   every process left in the namespace, ``setsid`` or not. It dies with the supervisor (``PR_SET_PDEATHSIG``).
2. Without namespaces (``isolation="landlock"``, or "auto" where ``unshare`` is refused): snippet.py goes into
   the host's work dir; the supervisor becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``), so orphans of
   any session come back to it; while the snippet runs it walks the work dir (`usage`) every `QUOTA_CHECK_S`
   and past ``disk`` bytes or ``inodes`` entries stops it (exit code 126, `QUOTA_MESSAGE` on stderr); when the
   snippet ends it kills its whole remaining process tree (walked in /proc, signalled by pidfd).
3. The snippet's process, before exec: a second user + mount namespace (in namespace mode), which locks the
   read-only mounts so that even root inside cannot remount them, with ``RLIMIT_NPROC`` counting its tree;
   rlimits (CPU, address space, file size, no core); ``PR_SET_NO_NEW_PRIVS``; Landlock where the kernel has it
   (ABI >= 1): writes, creations, removals, renames and links only beneath the work dir (and writes to
   /dev/null), reads refused in the work dir's siblings and the directories above it (without namespaces),
   TCP bind/connect refused when the network is off (ABI >= 4), signals and abstract unix sockets scoped to
   the sandbox (ABI >= 6). Then it execs `_sandbox_runner.py`, which adds the audit-hook tripwire and runs the
   snippet.

SIGUSR1 or SIGTERM (the tool's wall clock) kill the snippet and everything it started. The supervisor exits
with the snippet's own status (or dies by its signal); a layer it was asked for and could not build is exit
code 125 with "sandbox setup failed: ..." on stderr, and the snippet never runs. ``--landlock-abi`` prints the
kernel's Landlock ABI version (0: none). It knows processes, mounts and limits; it knows nothing about tools
or episodes.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import re
import resource
import select
import signal
import stat
import struct
import sys
import time
from typing import Any, Final, NoReturn

SNIPPET_UID: Final = 1000  # the snippet's uid inside its namespace when the tool runs as root
SETUP_FAILED: Final = 125  # exit code (and stderr prefix "sandbox setup failed:") when a layer breaks midway
QUOTA_EXCEEDED: Final = 126  # exit code (and QUOTA_MESSAGE on stderr) when the fallback's watch stopped the snippet
QUOTA_MESSAGE: Final = "sandbox: the work dir passed its disk quota"
QUOTA_CHECK_S: Final = 0.01  # without namespaces: how often (at least) the work dir's size is looked at
KILLED: Final = signal.SIGKILL  # a wait status: killed by SIGKILL
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
KEPT_FLAGS: Final = {"noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 24, 36, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# Landlock (linux/landlock.h)
LL_CREATE, LL_ADD_RULE, LL_RESTRICT = 444, 445, 446
LL_WRITE_FILE, LL_TRUNCATE, LL_REFER = 1 << 1, 1 << 14, 1 << 13
LL_READS: Final = (1 << 2) | (1 << 3)  # READ_FILE | READ_DIR
LL_MAKE_CHAR, LL_MAKE_BLOCK = 1 << 6, 1 << 11
LL_WRITES: Final = LL_WRITE_FILE | sum(1 << bit for bit in (4, 5, 6, 7, 8, 9, 10, 11, 12))  # remove/make *

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _checked(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def encode(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    result = libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _checked(result, f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _checked(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


def enter_user_namespace(flags: int, *, inside: int | None = None) -> None:
    """unshare a user namespace (plus `flags`) that maps only our own uid and gid (to `inside` if given)."""
    uid, gid = os.geteuid(), os.getegid()
    os.unshare(os.CLONE_NEWUSER | flags)
    new_uid, new_gid = (uid, gid) if inside is None else (inside, inside)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{new_uid} {uid} 1"), ("gid_map", f"{new_gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _mounts() -> list[tuple[str, int]]:
    """Mount points of this mount namespace with the flags a bind remount must keep."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            kept = sum(KEPT_FLAGS.get(option, 0) for option in fields[5].split(","))
            found.append((point, kept))
    return found


def _flags_at(path: str, mounts: list[tuple[str, int]]) -> int:
    best = max((p for p, _ in mounts if path == p or path.startswith(p.rstrip("/") + "/")), key=len)
    return dict(mounts)[best]


def make_read_only(workdir: str, disk: int, inodes: int) -> None:
    """In a fresh mount namespace: everything read-only, nosuid, nodev, except the work dir and a few devices.

    The work dir is a fresh tmpfs of `disk` bytes and `inodes` inodes mounted over the host's (empty) one:
    what the snippet writes never reaches the host's disk and vanishes with the namespace, and the work dirs
    of other calls, each on its own tmpfs in its own namespace, are not there to be seen.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    mounts = _mounts()
    options = f"size={disk},nr_inodes={inodes},mode=0700"
    _mount("agent-env-python", workdir, "tmpfs", MS_NOSUID | MS_NODEV | _flags_at(workdir, mounts), options)
    for point, kept in mounts:
        skipped = point == workdir or point.startswith(workdir + "/") or point == "/proc" or point.startswith("/proc/")
        if not skipped and os.path.exists(point):
            _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)
    for device in DEVICES:
        if os.path.exists(device):
            _mount(device, device, None, MS_BIND)
            _mount(None, device, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | _flags_at(device, mounts))
    os.chdir(workdir)  # the old working directory is the read-only one beneath the new bind


def mount_fresh_proc() -> None:
    """As PID 1 of the new PID namespace: a /proc that shows only this namespace (made read-only later)."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def landlock_abi() -> int:
    return max(0, int(libc.syscall(ctypes.c_long(LL_CREATE), None, ctypes.c_size_t(0), ctypes.c_uint32(1))))


def readable_around(workdir: str) -> list[str]:
    """Every path beside the way from / down to `workdir`'s parent (symlinks skipped: their targets are there too).

    Granting reads on these, and on `workdir` itself, grants them everywhere except in `workdir`'s siblings
    (other calls' work dirs) and in the directories on the way, which can be walked but not listed.
    """
    found = []
    parts = workdir.strip("/").split("/")
    for depth, part in enumerate(parts[:-1]):
        parent = "/" + "/".join(parts[:depth])
        with contextlib.suppress(OSError), os.scandir(parent) as entries:
            found += [e.path for e in entries if e.name != part and not e.is_symlink()]
    return found


def apply_landlock(abi: int, workdir: str, network: bool, *, hide_siblings: bool = False) -> None:
    """Writes only beneath `workdir` (and to /dev/null); TCP off unless `network`; signals scoped (ABI 6).

    `hide_siblings` (the fallback without namespaces, where other calls' work dirs are on the same disk and
    the same uid): reads too are refused in `workdir`'s siblings and in the directories above it (see
    `readable_around`); the interpreter's own directories stay readable wherever they are.
    """
    handled = LL_WRITES | (LL_REFER if abi >= 2 else 0) | (LL_TRUNCATE if abi >= 3 else 0)
    handled |= LL_READS if hide_siblings else 0
    net = 0b11 if abi >= 4 and not network else 0  # BIND_TCP | CONNECT_TCP
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    attr = struct.pack("=QQQ", handled, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _checked(libc.syscall(ctypes.c_long(LL_CREATE), buffer, ctypes.c_size_t(len(attr)), 0), "landlock")
    rules = [(workdir, handled & ~(LL_MAKE_CHAR | LL_MAKE_BLOCK))]
    rules.append(("/dev/null", handled & (LL_WRITE_FILE | LL_TRUNCATE)))
    if hide_siblings:
        own = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.abspath(__file__)), *sys.path[1:]}
        for path in sorted(own) + readable_around(workdir):
            if os.path.exists(path):  # a file takes READ_FILE alone (READ_DIR there is EINVAL)
                rules.append((path, LL_READS if os.path.isdir(path) else LL_READS & ~(1 << 3)))
    for path, allowed in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
        _checked(libc.syscall(ctypes.c_long(LL_ADD_RULE), ctypes.c_long(ruleset), ctypes.c_long(1), rule, 0), path)
        os.close(fd)
    _checked(libc.syscall(ctypes.c_long(LL_RESTRICT), ctypes.c_long(ruleset), 0), "landlock restrict_self")
    os.close(ruleset)


def _cap(kind: int, soft: int, hard: int) -> None:
    _, old_hard = resource.getrlimit(kind)
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(kind, (soft, hard))


def drop_capabilities() -> None:
    """No capability left, in any set, even for root: nothing can be remounted, loaded or signalled by privilege."""
    for capability in range(64):
        with contextlib.suppress(OSError):
            _prctl(PR_CAPBSET_DROP, capability)
    with contextlib.suppress(OSError):
        _checked(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
    _checked(libc.capset(header, ctypes.create_string_buffer(24)), "capset")


def _linux_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


def start_snippet(cfg: dict[str, Any], namespaces: bool, landlock: int) -> NoReturn:
    """In the forked child: the last layers, then the snippet in this same process (one interpreter start).

    Never returns: the snippet's end (or its SystemExit) ends the process like any Python program's.
    """
    try:
        if namespaces:
            # a uid other than 0 inside this second user namespace: its mounts come locked read-only
            enter_user_namespace(os.CLONE_NEWNS, inside=SNIPPET_UID if os.geteuid() == 0 else None)
            _mount(None, "/proc", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            # counted in this fresh user namespace: the snippet's own tree, beside the supervisor and init (the
            # fallback where there is no pids cgroup; a tool running as root is exempt, as root is everywhere).
            # Before Linux 5.14 the count was the uid's, host-wide: there it would starve the snippet instead.
            if _linux_at_least(5, 14):
                _cap(resource.RLIMIT_NPROC, cfg["processes"] - 2, cfg["processes"] - 2)
        os.setpgid(0, 0)
        _cap(resource.RLIMIT_CPU, cfg["cpu"], cfg["cpu"] + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
        _cap(resource.RLIMIT_AS, cfg["memory"], cfg["memory"])
        _cap(resource.RLIMIT_FSIZE, cfg["fsize"], cfg["fsize"])
        _cap(resource.RLIMIT_CORE, 0, 0)
        if sys.platform.startswith("linux"):
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            if landlock:
                apply_landlock(landlock, cfg["workdir"], cfg["network"], hide_siblings=not namespaces)
            drop_capabilities()
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_runner.py")
        spec = importlib.util.spec_from_file_location("_sandbox_runner", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        runner = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(runner)
    except BaseException as error:  # whatever broke, the snippet must not run half-sandboxed
        _setup_failed(error)
    runner.main(cfg)
    raise SystemExit(0)


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        children = parents.get(stack.pop(), [])
        found += children
        stack += children
    return found


def _kill_once(first: int) -> None:
    """SIGKILL the snippet's group and every descendant seen now (through pidfds: a reused pid is never hit)."""
    with contextlib.suppress(OSError):
        os.killpg(first, signal.SIGKILL)
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc/self"):  # not Linux: the group kill only
        return
    handles = {}
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            handles[pid] = os.pidfd_open(pid)
    still_ours = set(_descendants(os.getpid()))  # opened while still our descendant: the right process
    for pid, fd in handles.items():
        with contextlib.suppress(OSError):
            if pid in still_ours:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)


def kill_tree(first: int) -> None:
    """After the snippet was reaped: kill and reap every remaining descendant until none is left."""
    while True:
        _kill_once(first)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        if not hasattr(os, "pidfd_open"):  # without /proc we cannot see them: leave orphans to init
            return
        time.sleep(0.005)


def _mirror(status: int) -> None:
    """Exit the way the snippet did: same code, or the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP cannot be reset (nor caught)
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


STOP_SIGNALS: Final = {signal.SIGUSR1, signal.SIGTERM}


def _fork_child() -> int:
    """fork with the stop signals held until the parent has its handlers; the child starts with none held."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = os.fork()
    if pid == 0:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
    return pid


def _on_stop(action: Any) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: action())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _setup_failed(error: BaseException) -> NoReturn:
    os.write(2, f"sandbox setup failed: {error}\n".encode())
    os._exit(SETUP_FAILED)


def run_in_namespaces(cfg: dict[str, Any], landlock: int) -> None:
    reports_r, reports_w = os.pipe()
    init = _fork_child()
    if init == 0:  # PID 1 of the new namespace
        os.close(reports_r)
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            mount_fresh_proc()
        except BaseException as error:
            _setup_failed(error)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        snippet = os.fork()
        if snippet == 0:
            start_snippet(cfg, True, landlock)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == snippet:
                os.write(reports_w, str(status).encode())
                os._exit(0)  # the kernel now kills everything else in the namespace
    os.close(reports_w)
    _on_stop(lambda: os.kill(init, signal.SIGKILL))
    _, init_status = os.waitpid(init, 0)
    report = os.read(reports_r, 64)
    if not report:  # init died before the snippet ended: killed (wall clock), or its own setup failed
        _mirror(init_status if os.WIFEXITED(init_status) else KILLED)
    _mirror(int(report))


def _count(fd: int, totals: list[int]) -> list[str]:
    """Add the directory `fd`'s entries to totals ([bytes allocated, entries]); return its subdirectories."""
    subdirectories = []
    with contextlib.suppress(OSError), os.scandir(fd) as listing:
        for entry in listing:
            totals[1] += 1
            with contextlib.suppress(OSError):
                info = entry.stat(follow_symlinks=False)
                totals[0] += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    subdirectories.append(entry.name)
    return subdirectories


def usage(workdir: str) -> tuple[int, int]:
    """(bytes allocated, entries) beneath `workdir`, walked by directory fd (no recursion, no long paths).

    Down by ``openat(name)``, up by ``openat("..")``, one directory open at a time; a directory the snippet
    made unreadable is set back to 0700 to be counted (it is the call's own tree).
    """
    totals = [0, 0]
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(workdir, flags)
    frames = [_count(fd, totals)]  # per open level: the subdirectories still to count
    try:
        while frames:
            if not frames[-1]:
                frames.pop()
                if frames:
                    parent = os.open("..", flags, dir_fd=fd)
                    os.close(fd)
                    fd = parent
                continue
            child = frames[-1].pop()
            with contextlib.suppress(OSError, NotImplementedError):
                os.chmod(child, 0o700, dir_fd=fd, follow_symlinks=False)
            try:
                child_fd = os.open(child, flags, dir_fd=fd)
            except OSError:  # gone (or swapped for a symlink) since the listing: nothing to count there
                continue
            os.close(fd)
            fd = child_fd
            frames.append(_count(fd, totals))
    finally:
        os.close(fd)
    return totals[0], totals[1]


def _wait_within_quota(snippet: int, cfg: dict[str, Any]) -> int | None:
    """Reap children until the snippet ends (its wait status); None when the work dir passed its quota first.

    The work dir's size is looked at every `QUOTA_CHECK_S`, or twice as long as the last look took (a big tree
    takes longer to walk; the watch then uses at most a third of a CPU): a snippet can write for that long past
    the quota, and no more. This is a watch, not a kernel cap: a tmpfs (the namespace sandbox) is the cap.
    """
    pidfd = os.pidfd_open(snippet) if hasattr(os, "pidfd_open") else None
    pause = QUOTA_CHECK_S
    try:
        while True:
            if pidfd is not None:
                select.select([pidfd], [], [], pause)
            else:
                time.sleep(pause / 5)
            while True:  # the snippet is not reaped yet, so there is always a child to wait for
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == snippet:
                    return status
                if pid == 0:
                    break
            started = time.monotonic()
            allocated, entries = usage(cfg["workdir"])
            if allocated > cfg["disk"] or entries > cfg["inodes"]:
                return None
            pause = max(QUOTA_CHECK_S, 2 * (time.monotonic() - started))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def run_with_subreaper(cfg: dict[str, Any], landlock: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    snippet = _fork_child()
    if snippet == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        start_snippet(cfg, False, landlock)
    _on_stop(lambda: _kill_once(snippet))  # the loop below then reaps the snippet and kills the rest
    status = _wait_within_quota(snippet, cfg)
    if status is None:
        _kill_once(snippet)
        _, status = os.waitpid(snippet, 0)
        kill_tree(snippet)
        os.write(2, f"{QUOTA_MESSAGE}\n".encode())
        os._exit(QUOTA_EXCEEDED)
    kill_tree(snippet)
    _mirror(status)


def join_cgroups(procs_files: list[str]) -> None:
    """Move this process into the call's cgroups (their ``cgroup.procs``): everything it forks is counted."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write(str(os.getpid()))


def write_snippet(code: bytes) -> None:
    """The snippet's source, into the current directory (the work dir) as snippet.py."""
    fd = os.open("snippet.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    with open(fd, "wb") as f:
        f.write(code)


def main() -> None:
    """argv[1]: the config (JSON): workdir, cpu, memory, fsize, disk, inodes, processes, cgroups, network,
    namespaces, landlock, audit_hooks. stdin: the snippet's source (the snippet itself reads /dev/null)."""
    cfg = json.loads(sys.argv[1])
    try:
        join_cgroups(cfg["cgroups"])  # first, before anything is forked
        code = sys.stdin.buffer.read()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(cfg["workdir"])
    except OSError as error:
        _setup_failed(error)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    landlock = 0
    if cfg["landlock"]:
        with contextlib.suppress(OSError, AttributeError):
            landlock = landlock_abi()
    if not cfg["namespaces"]:
        try:
            write_snippet(code)  # on the host's disk, watched by `run_with_subreaper`
        except OSError as error:
            _setup_failed(error)
        run_with_subreaper(cfg, landlock)
    try:
        enter_user_namespace(os.CLONE_NEWNS | os.CLONE_NEWPID | (0 if cfg["network"] else os.CLONE_NEWNET))
        make_read_only(cfg["workdir"], cfg["disk"], cfg["inodes"])
        write_snippet(code)  # on the call's own tmpfs
    except (AttributeError, OSError) as error:  # never run a snippet on half-built namespaces
        _setup_failed(error)
    run_in_namespaces(cfg, landlock)


if __name__ == "__main__":
    if sys.argv[1:] == ["--landlock-abi"]:
        print(landlock_abi())
    else:
        main()
