"""Serve the same ASGI app from N Ray Serve replicas behind Ray Serve's HTTP proxy (`apps/serve --replicas N`).

Each replica calls `build_app()` itself (Ray Serve's `@serve.ingress(builder)`: the builder runs when the replica
starts), so each builds its own engine and transcript store from the same settings; nothing built is pickled. Every
response carries `x-agent-replica` (the replica's id) so a client can tell which replica answered. Ray is imported
here only, and lazily: plain serving never imports it, and without Ray Serve installed `require_ray_serve` (called
by `serve_replicas`, and by `apps/serve` before it loads anything) raises `RayServeMissing` naming the extra to
install, `agent-runtime[replicas]`. Locally Ray is started by `serve_replicas` (no dashboard, a small object
store) and stopped again on SIGINT/SIGTERM; with `ray_address` the app is deployed on that cluster and deleted from it
on exit.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["REPLICA_HEADER", "RayServeMissing", "ReplicaHeader", "require_ray_serve", "serve_replicas"]

REPLICA_HEADER = "x-agent-replica"
APP_NAME = "agent"
OBJECT_STORE_BYTES = 128 * 1024 * 1024  # replicas pass HTTP bodies, not tensors: Ray's minimum-sized store is plenty
READY_TIMEOUT_S = 600  # replicas load their model before they are ready


class RayServeMissing(RuntimeError):
    """Ray Serve is not installed where `--replicas` was asked for."""


def require_ray_serve() -> None:
    """Raise `RayServeMissing` (saying what to install) unless `ray.serve` can be imported here. The first import of
    Ray in the process: Ray reads `RAY_ENABLE_UV_RUN_RUNTIME_ENV` when it is imported, so it is set here, before."""
    # else a driver under `uv run` ships its working directory to the cluster and runs every worker under `uv run`
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    try:
        import ray.serve  # noqa: F401
    except ImportError as e:
        raise RayServeMissing(
            f"--replicas needs Ray Serve, which is not installed here ({e}): install the agent-runtime[replicas] "
            "extra, e.g. `pip install 'agent-runtime[replicas]'` (it brings ray[serve])"
        ) from e


class ReplicaHeader:
    """ASGI middleware: every HTTP response names the replica that wrote it."""

    def __init__(self, app: ASGIApp, replica: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, tagged)


def _replica_app(build_app: Callable[[], Starlette]) -> Callable[[], Starlette]:
    """The builder Ray Serve runs in each replica: the app, tagged with that replica's id. (Ray Serve adds its own
    exception handlers to the app, so the app stays the Starlette app and the tag is its outermost middleware.)"""

    def build() -> Starlette:
        from ray import serve

        app = build_app()
        app.add_middleware(ReplicaHeader, replica=serve.get_replica_context().replica_id.unique_id)
        return app

    return build


def serve_replicas(
    build_app: Callable[[], Starlette],
    *,
    replicas: int,
    host: str,
    port: int,
    ray_address: str | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Deploy `build_app` as `replicas` Ray Serve replicas behind Ray's HTTP proxy on host:port; block until SIGINT
    or SIGTERM, then delete the application (and, when Ray was started here, stop Serve and Ray)."""
    require_ray_serve()
    import ray
    from ray import serve

    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    local = ray_address is None
    try:
        if local:
            ray.init(
                num_cpus=max(os.cpu_count() or 1, replicas + 1),
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                log_to_driver=False,
            )
        else:
            ray.init(address=ray_address, log_to_driver=False)
        # ray.init puts in its own SIGTERM handlers (one exits at once, its core worker's aborts the process after
        # logging): ours again, so SIGTERM deletes the application and stops as Ctrl-C does
        for sig in previous:
            signal.signal(sig, on_signal)
        serve.start(http_options={"host": host, "port": port})
        deployment: Any = serve.deployment(
            serve.ingress(_replica_app(build_app))(),
            name="AgentServer",
            num_replicas=replicas,
            ray_actor_options={"num_cpus": 1},
            health_check_period_s=2,
            health_check_timeout_s=30,
        )
        serve.run(deployment.bind(), name=APP_NAME, route_prefix="/", blocking=False)
        _wait_ready(serve, stop)
        if not stop.is_set() and on_ready is not None:
            on_ready()
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if ray.is_initialized():
            try:
                serve.delete(APP_NAME)
                if local:
                    serve.shutdown()
            finally:
                ray.shutdown()


def _wait_ready(serve: Any, stop: threading.Event) -> None:
    """Until the application is RUNNING (every replica built its app); a deploy that fails raises its message."""
    from ray.serve.schema import ApplicationStatus

    for _ in range(READY_TIMEOUT_S * 4):
        if stop.wait(0.25):
            return
        status = serve.status().applications.get(APP_NAME)
        if status is None:
            continue
        if status.status == ApplicationStatus.RUNNING:
            return
        if status.status == ApplicationStatus.DEPLOY_FAILED:
            raise RuntimeError(f"the replicas failed to start: {status.message}")
    raise RuntimeError(f"the replicas were not ready within {READY_TIMEOUT_S} s")
