"""`apps/serve` as a user starts it: a real subprocess (`python apps/serve ...`), started, waited for until it prints
its "Serving at" banner, and stopped with Ctrl-C (SIGINT), as a terminal would.

    with ServeProcess(["--model", path, "--port", str(free_port())]) as app:
        client = OpenAI(base_url=f"{app.url}/v1", api_key="unused")
    app.returncode, app.stderr      # after the block: how it stopped and what it logged
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "apps" / "serve"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServeProcess:
    """`python apps/serve *args` in the repository root, with `env` added to this process's environment."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str] | None = None, start_timeout: float = 120):
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.start_timeout = start_timeout
        self.banner = ""
        self.stderr = ""
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        return self.banner.split("Serving at ", 1)[1].split()[0]

    def __enter__(self) -> ServeProcess:
        command = [sys.executable, str(APP), *self.args]
        # stderr (the server's logs) goes to a file: a pipe nobody reads until the end fills up and blocks the server
        self._log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.process.stdout or []], daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        try:
            while "Serving at" not in self.banner:
                if self.process.poll() is not None:
                    raise AssertionError(f"apps/serve exited with {self.process.returncode}: {self._stderr()[-3000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"apps/serve did not start within {self.start_timeout} s")
                try:
                    self.banner = lines.get(timeout=1)
                except queue.Empty:
                    continue
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop()

    def _stderr(self) -> str:
        self._log.seek(0)
        return self._log.read()

    def _stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr = self._stderr()
        self._log.close()
        self.returncode = self.process.returncode
