"""`apps/serve --replicas 2 --ray-address ADDR` on a Ray cluster that was already running: a real head node started
with `ray start --head` (on loopback, declared CPUs, a small object store, its own temp dir and ports), the server
deploying the application `agent` there. Both replicas answer and run in the cluster's processes, not the server's;
SIGTERM deletes the application from the cluster and leaves the cluster (and Ray Serve on it) running, as the
README promises. The head is then stopped by terminating the `ray start --block` that started it: `ray stop` would
stop every Ray on the machine, other tests' included."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.serve.test_ray_replicas import ROOT, chat, replica_processes
from tests.support.serve_process import ServeProcess, free_port

pytest.importorskip("ray.serve")

RAY = Path(sys.executable).parent / "ray"
ENV = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
# run in a fresh interpreter (this test's process never joins the cluster): the applications Ray Serve runs on the
# cluster at ADDR and its alive nodes
INSPECT = """
import json, sys, ray
from ray import serve
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps({"apps": sorted(serve.status().applications), "nodes": sum(n["Alive"] for n in ray.nodes())}))
"""


def cluster_state(address: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", INSPECT, address], env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return state


@pytest.fixture
def ray_head() -> Iterator[str]:
    """A Ray head node on loopback, started as a user starts one; its address (HOST:PORT)."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    command = [
        str(RAY), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
        "--num-cpus", "4", "--num-gpus", "0", "--object-store-memory", str(128 * 2**20),
        "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp_dir,
        "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
        "--metrics-export-port", str(free_port()),
    ]  # fmt: skip
    # the log is a file, not a pipe: nobody reads it while the head runs
    with tempfile.TemporaryFile(mode="w+") as log:
        head = subprocess.Popen(command, env=ENV, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                if head.poll() is not None:
                    log.seek(0)
                    raise AssertionError(f"ray start exited with {head.returncode}: {log.read()[-3000:]}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise AssertionError("the Ray head did not listen within 120 s") from None
                    time.sleep(0.5)
            yield f"127.0.0.1:{port}"
        finally:
            _stop(head)
            shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(head: subprocess.Popen[str]) -> None:
    """SIGTERM to `ray start --block`, which stops what it started; a straggler is killed, not left behind."""
    started = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
    for process in started:
        try:
            process.wait(timeout=30)
        except psutil.TimeoutExpired:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def test_replicas_deploy_on_a_running_cluster_and_leave_it_running(ray_head: str, tiny_qwen3_dir: Path) -> None:
    args = [
        "--model", str(tiny_qwen3_dir), "--recipe", str(ROOT / "recipes" / "calculator.py"),
        "--port", str(free_port()), "--replicas", "2", "--ray-address", ray_head, "--log-format", "json",
    ]  # fmt: skip
    with ServeProcess(args, start_timeout=300) as app:
        client = httpx.Client(base_url=app.url, timeout=60)
        seen: set[str] = set()
        for _ in range(40):  # Ray's proxy spreads requests over the replicas: both answer within a few
            seen.add(chat(client))
            if len(seen) == 2:
                break
        assert len(seen) == 2, seen
        # the replicas are the cluster's processes: the server started no Ray of its own
        server = psutil.Process(app.process.pid)
        assert not replica_processes(server)
        assert not [p for p in server.children(recursive=True) if "raylet" in p.name() or "gcs_server" in p.name()]
        assert cluster_state(ray_head)["apps"] == ["agent"]
        app.process.send_signal(signal.SIGTERM)
        app.process.wait(timeout=60)
    assert app.returncode == 0, app.stderr[-3000:]
    # the driver shipped no uv runtime env (its working directory) to the cluster: RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
    # was set before Ray's first import
    assert "Pushing file package" not in app.stderr
    events = [json.loads(line) for line in app.stderr.splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("level") == "error"], events

    # the application is gone from the cluster; the cluster and Ray Serve's proxy on it still run
    assert cluster_state(ray_head) == {"apps": [], "nodes": 1}
    response = client.get("/health")
    assert response.status_code == 404 and "x-agent-replica" not in response.headers, response.text
    client.close()
