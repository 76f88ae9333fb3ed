"""Take the trajectory viewer's screenshot for the READMEs (``docs/trajectory_viewer.png``).

    uv run scripts/viewer_screenshot.py [--out docs/trajectory_viewer.png]

The compaction demo's scripted expert plays three held-out lists through the demo recipe's own session on the
demo's own tokenizer (as `tests/agent_demo/test_viewer_running_total.py` does); the records are written as a run
writes them, served by `create_viewer_app`, and a headless Chromium (Debian's ``/usr/bin/chromium``) opens one
episode, compares another beside it and hovers a summary token. Nothing is downloaded; no model is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from agent_demo import running_total
from agent_demo.running_total_expert import RunningTotalExpert, train_running_total_tokenizer
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, ScriptedEngine, TrajectoryWriter
from agent_runtime.serving import create_viewer_app

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def write_episodes(log: Path) -> HFTokenizer:
    recipe = running_total.make_recipe()
    tokenizer = HFTokenizer(
        train_running_total_tokenizer(recipe.chat_protocol(), recipe.environment().tools, episodes=300)
    )
    engine = ScriptedEngine(tokenizer, policy=RunningTotalExpert(tokenizer, recipe.chat_protocol()), logprob=-0.12)
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
    rows = list(recipe.rows("test"))[:3]
    results = asyncio.run(runtime.run_many([row["prompt"] for row in rows], tasks=rows))
    writer = TrajectoryWriter(log)
    for result in results:
        writer.write(result.trajectory)
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="uv run scripts/viewer_screenshot.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "trajectory_viewer.png")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} is missing (apt-get install -y chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "compaction_demo" / "episodes.jsonl"
        tokenizer = write_episodes(log)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = create_viewer_app(log.parent, tokenizer=tokenizer)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1500, "height": 950})
                page.goto(f"http://127.0.0.1:{port}/")
                rows = page.locator("#list li")
                rows.nth(2).wait_for()
                rows.first.click()
                page.locator("#left .segment").first.wait_for()
                rows.nth(1).locator(".compare").click()
                page.locator("#right .segment").first.wait_for()
                for pane in ("#left", "#right"):  # scroll each pane to its tokens
                    page.eval_on_selector(f"{pane} .tokens-heading", "h => h.scrollIntoView()")
                page.locator("#left .segment[data-segment='0'] .tok.summary").first.hover()
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out))
                browser.close()
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
