"""The compaction demo's episodes in the trajectory viewer, in a real headless Chromium (as
`tests/serve/test_viewer_page.py`): the demo's scripted expert plays held-out lists through the recipe's own
session on the demo's own tokenizer, the records are logged as a run logs them (`TrajectoryWriter`), and the page
shows every segment of an episode compacted three times: each boundary naming the summary the next segment starts
from, each summary turn marked, and every token's colour the record's loss mask, token for token."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from agent_demo import running_total
from agent_demo.running_total_expert import RunningTotalExpert, train_running_total_tokenizer
from agent_protocol import HFTokenizer
from agent_runtime import AgentRuntime, ScriptedEngine, Trajectory, TrajectoryWriter
from agent_runtime.serving import create_viewer_app
from tests.serve.conftest import LiveServer
from tests.serve.test_viewer_page import assert_colours_match, drawn_tokens  # skips this module without the browser
from tests.serve.test_web_page import chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def tokenizer() -> HFTokenizer:
    recipe = running_total.make_recipe()
    return HFTokenizer(train_running_total_tokenizer(recipe.chat_protocol(), recipe.environment().tools, episodes=300))


@pytest.fixture(scope="module")
def episodes(tokenizer: HFTokenizer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Trajectory]]:
    recipe = running_total.make_recipe()
    engine = ScriptedEngine(tokenizer, policy=RunningTotalExpert(tokenizer, recipe.chat_protocol()))
    runtime = AgentRuntime(engine, recipe.make_session(tokenizer), sampling=recipe.sampling)
    rows = list(recipe.rows("test"))[:3]
    with ThreadPoolExecutor(1) as thread:  # its own event loop: Playwright's sync API may hold this thread's
        results = thread.submit(asyncio.run, runtime.run_many([row["prompt"] for row in rows], tasks=rows)).result()
    log = tmp_path_factory.mktemp("run") / "episodes.jsonl"
    writer = TrajectoryWriter(log)
    for result in results:
        writer.write(result.trajectory)
    return log, [result.trajectory for result in results]


@pytest.fixture(scope="module")
def viewer(episodes: tuple[Path, list[Trajectory]], tokenizer: HFTokenizer) -> Iterator[LiveServer]:
    server = LiveServer(create_viewer_app(episodes[0], tokenizer=tokenizer)).start()
    yield server
    server.stop()


def test_a_compaction_demo_episode_shows_every_segment_and_summary(
    browser: Browser, viewer: LiveServer, episodes: tuple[Path, list[Trajectory]], tokenizer: HFTokenizer
) -> None:
    _, trajectories = episodes
    trajectory = trajectories[0]
    assert trajectory.compactions >= running_total.MIN_HELD_OUT_COMPACTIONS and trajectory.reward == 1.0
    summaries = [
        m.content for m in trajectory.messages if m.role == "assistant" and (m.content or "").startswith("Total ")
    ]
    assert len(summaries) == trajectory.compactions

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(viewer.url)
    expect(page.locator("#list li")).to_have_count(len(trajectories))
    expect(page.locator("#list li").first).to_contain_text(f"{trajectory.compactions} compaction(s)")
    page.locator("#list li").first.click()
    expect(page.locator("#left .segment")).to_have_count(len(trajectory.segments))
    boundaries = page.locator("#left .segment-boundary.compaction")
    expect(boundaries).to_have_count(trajectory.compactions)
    for boundary, summary in zip(boundaries.all(), summaries, strict=True):
        expect(boundary).to_contain_text(f"“{summary}”")
    for index, segment in enumerate(trajectory.segments):
        assert_colours_match(drawn_tokens(page, "left", index), trajectory, index)
        marked = page.locator(f"#left .segment[data-segment='{index}'] .tok.summary")
        if index < len(trajectory.segments) - 1:  # every compacted segment ends with its summary turn
            start, end = segment.action_ranges[-1]
            expect(marked).to_have_count(end - start)
            assert tokenizer.decode(segment.ids[start:end]).startswith(summaries[index])
        else:
            expect(marked).to_have_count(0)
    expect(page.locator("#left .answer")).to_contain_text(trajectory.final_answer or "")
    page.close()
