"""The trajectory viewer shows policy versions: over HTTP, a record's view carries its versions, the engine's version
and the staleness, and each action span its version; in a real headless Chromium (as `test_viewer_page.py`), each
action span gets a "vN" badge before its first token (a turn that a weight update split shows two), every sampled
token its version on hover, and the episode its versions and staleness; a record without versions shows none of
them. The records are the real session's, on the real Qwen3 tokenizer, written by `TrajectoryWriter`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect

from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, ScriptedEngine, TrajectoryWriter
from agent_runtime.serving import create_viewer_app
from tests.agent_runtime.test_session import QUESTION, answer, call, make_session
from tests.serve.conftest import LiveServer
from tests.serve.test_viewer_page import drawn_tokens, open_file_record, open_viewer
from tests.serve.test_web_page import chromium  # skips this module too where the browser is missing
from tests.serve.viewer_records import read_trajectories

SPLIT_AT = 4  # the first turn's tokens from version 3 up to here, from version 4 after


def versioned_log(tokenizer: HFTokenizer, log: Path, *, versions: bool) -> Path:
    """The calculator episode (a tool call, then the answer), its first turn split by an update to version 4 after
    `SPLIT_AT` tokens and the engine at version 5 when the record was built; or the same episode untracked."""
    first, second = tokenizer.encode(call("17 * 23")), tokenizer.encode(answer("391"))
    replayed = [[3] * SPLIT_AT + [4] * (len(first) - SPLIT_AT), [4] * len(second)] if versions else []
    engine = ScriptedEngine(tokenizer, [first, second], logprob=-0.5, versions=replayed)
    if versions:
        engine.set_policy_version(5)
    episode = AgentRuntime(engine, make_session(tokenizer)).run(QUESTION, task={"answer": "391"})
    with ThreadPoolExecutor(1) as thread:  # in its own thread: Playwright's sync API holds this one's event loop
        result = thread.submit(asyncio.run, episode).result()
    TrajectoryWriter(log).write(result.trajectory)
    return log


@pytest.fixture(scope="module")
def runs(tokenizer: HFTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("versions")
    versioned_log(tokenizer, root / "a_versioned.jsonl", versions=True)
    versioned_log(tokenizer, root / "b_untracked.jsonl", versions=False)
    return root


@pytest.fixture(scope="module")
def viewer(runs: Path, tokenizer: HFTokenizer) -> Iterator[LiveServer]:
    server = LiveServer(create_viewer_app(runs, tokenizer=tokenizer)).start()
    yield server
    server.stop()


def view(server: LiveServer, file: str) -> dict[str, Any]:
    items = httpx.get(f"{server.url}/trajectories", timeout=30).json()["items"]
    (chosen,) = [item["id"] for item in items if item["file"] == file]
    record: dict[str, Any] = httpx.get(f"{server.url}/trajectories/{chosen}", timeout=30).json()
    return record


def test_the_view_carries_the_versions_and_the_staleness(viewer: LiveServer, runs: Path) -> None:
    logged = read_trajectories(runs / "a_versioned.jsonl")[0]
    record = view(viewer, "a_versioned.jsonl")
    assert (record["policy_versions"], record["policy_version"], record["staleness"]) == ([3, 4], 5, 2)
    (segment,) = record["segments"]
    actions = [span for span in segment["spans"] if span["kind"] == "action"]
    (a, b), (c, d) = logged.segments[0].action_ranges
    assert actions == [
        {"kind": "action", "start": a, "end": a + SPLIT_AT, "version": 3},
        {"kind": "action", "start": a + SPLIT_AT, "end": b, "version": 4},
        {"kind": "action", "start": c, "end": d, "version": 4},
    ]
    old = view(viewer, "b_untracked.jsonl")
    assert (old["policy_versions"], old["policy_version"], old["staleness"]) == ([], None, None)
    assert all("version" not in span for span in old["segments"][0]["spans"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


def test_the_page_shows_each_action_spans_version_and_the_staleness(
    browser: Browser, viewer: LiveServer, runs: Path
) -> None:
    logged = read_trajectories(runs / "a_versioned.jsonl")[0]
    stored = logged.segments[0]
    page = open_viewer(browser, viewer)
    open_file_record(page, "a_versioned.jsonl")
    expect(page.locator("#left .versions")).to_have_text("policy versions 3, 4 · current 5 · staleness 2")
    badges = page.locator("#left .segment .version")
    expect(badges).to_have_text(["v3", "v4", "v4"])
    (a, b), _ = stored.action_ranges
    assert badges.nth(1).get_attribute("title") == f"policy version 4: tokens {a + SPLIT_AT}-{b}"
    tokens = page.eval_on_selector_all(
        "#left .segment[data-segment='0'] .tok", "spans => spans.map(s => s.dataset.version ?? null)"
    )
    expected = [None] * len(stored.ids)
    for span in stored.spans:
        if span.kind == "action":
            expected[span.start : span.end] = [str(span.version)] * (span.end - span.start)
    assert tokens == expected  # every sampled token its version, nothing on the prompt and the tool result
    assert len(drawn_tokens(page, "left", 0)) == len(stored.ids)  # the badges are not tokens
    page.locator("#left .segment .tok").nth(a + SPLIT_AT).hover()
    expect(page.locator("#hover-info")).to_contain_text("policy version 4")
    page.locator("#left .segment .tok").nth(a).hover()
    expect(page.locator("#hover-info")).to_contain_text("policy version 3")

    open_file_record(page, "b_untracked.jsonl")
    expect(page.locator("#left h2")).to_contain_text("b_untracked.jsonl")
    expect(page.locator("#left .versions")).to_have_count(0)
    expect(page.locator("#left .segment .version")).to_have_count(0)
    page.locator("#left .segment .tok").nth(a).hover()
    expect(page.locator("#hover-info")).not_to_contain_text("policy version")
