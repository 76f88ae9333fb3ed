"""`bench/bench_serve.py`'s own parts that a figure depends on: how it names the servers' interpreter build, how it
splits a process's CPU into user and system time, and the clear error when `--server-python` cannot run a server
(the whole bench runs in minutes; the README runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_serve  # noqa: E402


def test_the_interpreter_is_named_with_its_version_and_how_libpython_is_loaded() -> None:
    described = bench_serve.interpreter(sys.executable)
    assert described.startswith(f"CPython {sys.version.split()[0]} (")
    loaded = any("libpython" in line for line in Path("/proc/self/maps").read_text().splitlines())
    assert ("libpython a shared library" if loaded else "libpython linked in") in described
    configure = sysconfig.get_config_var("CONFIG_ARGS") or ""
    pgo = "--enable-optimizations" in configure or "-fprofile-use" in _flags()
    lto = "--with-lto" in configure or "-flto" in _flags()
    build = {(True, True): "PGO and LTO", (True, False): "PGO", (False, True): "LTO", (False, False): "no PGO or LTO"}
    assert f"({build[pgo, lto]} in its sysconfig;" in described


def test_a_process_cpu_is_split_into_user_and_system_time_as_the_kernel_counts_them() -> None:
    for _ in range(3):  # some of each: Python work (user) and writes the kernel does (system)
        sum(range(2_000_000))
        with open(os.devnull, "wb") as sink:
            for _ in range(20_000):
                sink.write(b"x")
                sink.flush()
    user, system = bench_serve.cpu_seconds(os.getpid())
    ours = os.times()  # the same counters, read another way: they agree to a clock tick
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert abs(user - ours.user) <= 2 * tick and abs(system - ours.system) <= 2 * tick, (user, system, ours)
    assert user > 0 and system > 0


def test_a_server_python_without_the_packages_fails_at_once_and_says_how_to_see_why(tmp_path: Path) -> None:
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_serve.py"), "--seconds", "0.2", "--rounds", "1",
         "--port", "18790", "--server-python", str(bare / "bin" / "python")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0
    assert "server exited with code 1 before it answered" in done.stderr, done.stderr[-2000:]
    assert "--serve bare --port 18790` shows why" in done.stderr


def _flags() -> str:
    return " ".join(
        str(sysconfig.get_config_var(n) or "") for n in ("PY_CFLAGS", "PY_CFLAGS_NODIST", "PY_LDFLAGS_NODIST")
    )
