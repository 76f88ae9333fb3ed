"""The trajectory viewer in a real headless Chromium (Debian's `chromium`, driven by Playwright, as
`test_web_page.py`), over trajectory files the real server logged (the real Qwen3 tokenizer, the real session):
every token's colour checked against the record's loss mask, token for token; its id, piece and logprob on
hover; a compacted episode's boundary and summary turn; a vision episode's images (attached, and returned by a
tool); the errors and the reward breakdown; the filters; a file larger than a page loaded a page at a time;
malformed lines reported; two records side by side.

The browser is found (or the module skipped, or failed in CI) as `test_web_page.py` finds it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from agent_protocol import HFTokenizer
from agent_runtime import Trajectory
from agent_runtime.serving import create_viewer_app
from tests.agent_protocol.families.test_qwen3_vl import png
from tests.serve.conftest import LiveServer, ServerFactory
from tests.serve.test_web_page import chromium  # skips this module too where the browser is missing
from tests.serve.viewer_records import (
    SUMMARY,
    calculator_log,
    compacted_log,
    copies,
    masked_file,
    read_trajectories,
    step_file,
    vision_log,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def runs(start_server: ServerFactory, tokenizer: HFTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a_calc.jsonl, b_compacted.jsonl, c_vision.jsonl, d_steps/step_{10,20}.jsonl, e_masked.jsonl."""
    root = tmp_path_factory.mktemp("viewed")
    calc = calculator_log(start_server, root / "a_calc.jsonl")
    compacted_log(tokenizer, root / "b_compacted.jsonl")
    vision_log(start_server, tokenizer, root / "c_vision.jsonl", tmp_path_factory.mktemp("zoom"))
    (root / "d_steps").mkdir()
    step_file(calc, root / "d_steps" / "step_10.jsonl", 10)
    step_file(calc, root / "d_steps" / "step_20.jsonl", 20)
    masked_file(calc, root / "e_masked.jsonl")
    return root


@pytest.fixture(scope="module")
def big(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The calculator's 4 records 30 times over (120), a malformed line after copies 0, 10 and 20."""
    return copies(runs / "a_calc.jsonl", tmp_path_factory.mktemp("big") / "many.jsonl", 30, malformed_every=10)


@pytest.fixture(scope="module")
def viewer(runs: Path, tokenizer: HFTokenizer) -> Iterator[LiveServer]:
    server = LiveServer(create_viewer_app(runs, tokenizer=tokenizer)).start()
    yield server
    server.stop()


def open_viewer(browser: Browser, server: LiveServer, query: str = "") -> Page:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{server.url}/{query}")
    expect(page.locator("#list li").first).to_be_visible()
    return page


def open_file_record(page: Page, file_name: str, nth: int = 0) -> None:
    page.select_option("#file", label=next(o for o in page.locator("#file option").all_inner_texts()
                                           if o.startswith(file_name)))  # fmt: skip
    rows = page.locator("#list li")
    expect(rows.first.locator(".meta")).to_contain_text(file_name)
    rows.nth(nth).click()


def drawn_tokens(page: Page, pane: str, segment: int) -> list[dict[str, Any]]:
    tokens: list[dict[str, Any]] = page.eval_on_selector_all(
        f"#{pane} .segment[data-segment='{segment}'] .tok",
        "spans => spans.map(s => ({id: s.dataset.id, cls: s.className, text: s.textContent,"
        " logprob: s.dataset.logprob, start: s.dataset.start, end: s.dataset.end}))",
    )
    return tokens


def assert_colours_match(tokens: list[dict[str, Any]], trajectory: Trajectory, segment: int) -> None:
    """Every token drawn in order, trained exactly where the record's loss mask is 1 (an image's pads as one)."""
    stored = trajectory.segments[segment]
    images = {image.start: image for image in stored.images}
    at = 0
    for token in tokens:
        if at in images:
            assert (int(token["start"]), int(token["end"])) == (images[at].start, images[at].end)
            assert "context" in token["cls"].split()
            at = images[at].end
            continue
        classes = token["cls"].split()
        assert int(token["id"]) == stored.ids[at]
        assert ("trained" in classes) == (stored.loss_mask[at] == 1), f"token {at}"
        assert ("context" in classes) == (stored.loss_mask[at] == 0), f"token {at}"
        logprob = stored.logprobs[at]
        assert token["logprob"] == ("" if logprob is None else str(logprob).removesuffix(".0"))
        at += 1
    assert at == len(stored.ids)


def test_the_loss_mask_colouring_is_the_records_token_for_token(
    browser: Browser, viewer: LiveServer, runs: Path, tokenizer: HFTokenizer
) -> None:
    logged = read_trajectories(runs / "a_calc.jsonl")[0]
    page = open_viewer(browser, viewer)
    open_file_record(page, "a_calc.jsonl")
    expect(page.locator("#left .segment")).to_have_count(1)
    tokens = drawn_tokens(page, "left", 0)
    assert len(tokens) == len(logged.segments[0].ids)
    assert_colours_match(tokens, logged, 0)
    assert [t["text"] for t in tokens] == [tokenizer.decode([i]) for i in logged.segments[0].ids]
    trained = sum(logged.segments[0].loss_mask)
    assert 0 < trained < len(tokens)
    expect(page.locator("#left .segment .tok.trained")).to_have_count(trained)
    # a sampled turn the trainer leaves out: context-coloured though it has logprobs
    masked = read_trajectories(runs / "e_masked.jsonl")[0]
    open_file_record(page, "e_masked.jsonl")
    expect(page.locator("#left .segment .tok.trained")).to_have_count(sum(masked.segments[0].loss_mask))
    assert_colours_match(drawn_tokens(page, "left", 0), masked, 0)
    open_file_record(page, "a_calc.jsonl")
    expect(page.locator("#left h2")).to_contain_text("a_calc.jsonl")
    # hover: the token's id, piece and logprob
    first_trained = next(i for i, m in enumerate(logged.segments[0].loss_mask) if m)
    page.locator("#left .segment .tok").nth(first_trained).hover()
    piece = tokenizer.decode([logged.segments[0].ids[first_trained]])
    expect(page.locator("#hover-info")).to_contain_text(f"id {logged.segments[0].ids[first_trained]}")
    expect(page.locator("#hover-info")).to_contain_text("logprob -0.25 · trained")
    expect(page.locator("#hover-info")).to_contain_text(piece.strip() or "piece")
    # the tool call and its result, the reward
    expect(page.locator("#left .tool-call")).to_contain_text("calculator(")
    expect(page.locator("#left .message.tool")).to_have_count(1)
    expect(page.locator("#left table.breakdown")).to_contain_text("total")
    page.close()


def test_a_compacted_episode_shows_its_boundary_and_summary_turn(
    browser: Browser, viewer: LiveServer, runs: Path
) -> None:
    logged = read_trajectories(runs / "b_compacted.jsonl")[0]
    page = open_viewer(browser, viewer)
    open_file_record(page, "b_compacted.jsonl")
    expect(page.locator("#left .segment")).to_have_count(2)
    boundary = page.locator("#left .segment-boundary.compaction")
    expect(boundary).to_have_count(1)
    expect(boundary).to_contain_text(f"starts from the summary “{SUMMARY}”")
    for index in (0, 1):
        assert_colours_match(drawn_tokens(page, "left", index), logged, index)
    start, end = logged.segments[0].action_ranges[-1]
    summary = page.locator("#left .segment[data-segment='0'] .tok.summary")
    expect(summary).to_have_count(end - start)
    assert "".join(summary.all_text_contents()) == f"{SUMMARY}<|im_end|>"
    expect(page.locator("#left .segment[data-segment='1'] .tok.summary")).to_have_count(0)
    page.close()


def test_a_vision_episode_shows_its_images(browser: Browser, viewer: LiveServer, runs: Path) -> None:
    attached, zoomed = read_trajectories(runs / "c_vision.jsonl")
    url = "data:image/png;base64," + base64.b64encode(png(300, 200)).decode()
    page = open_viewer(browser, viewer)
    open_file_record(page, "c_vision.jsonl")
    image = page.locator("#left .segment[data-segment='0'] .tok.image")
    expect(image).to_have_count(1)
    assert image.locator("img").get_attribute("src") == url
    [span] = attached.segments[0].images
    expect(image).to_contain_text(f"{span.end - span.start} pads")
    assert_colours_match(drawn_tokens(page, "left", 0), attached, 0)
    expect(page.locator("#left .message.user img.thumb")).to_have_count(1)
    # the zoom episode: the tool returned images, shown under its result and among the tokens
    page.locator("#list li").nth(1).click()
    expect(page.locator("#left .tool-call")).to_contain_text("zoom")
    drawn = len(zoomed.segments[0].images)
    expect(page.locator("#left .segment[data-segment='0'] .tok.image")).to_have_count(drawn)
    assert_colours_match(drawn_tokens(page, "left", 0), zoomed, 0)
    # the zoom tool returned bytes (inlined as a data URL: drawn) and a file it wrote (a path: named, never read)
    expect(page.locator("#left .message.tool img.thumb")).to_have_count(1)
    expect(page.locator("#left .message.tool")).to_contain_text("[image not shown: ")
    expect(page.locator("#left .message.tool")).to_contain_text("zoomed.png]")
    expect(page.locator("#left .segment .tok.image img")).to_have_count(drawn - 1)
    page.close()


def test_errors_and_filters(browser: Browser, viewer: LiveServer) -> None:
    page = open_viewer(browser, viewer)
    expect(page.locator("#status")).to_contain_text("all scanned")
    total = page.locator("#list li").count()
    page.fill("#error-code", "engine_error")
    page.click("#apply")
    rows = page.locator("#list li")
    expect(rows).to_have_count(3)  # the failed episode in a_calc and in each step file
    for row in rows.all():
        expect(row).to_contain_text("engine_error")
    rows.first.click()
    expect(page.locator("#left .errors li")).to_contain_text("engine_error")
    page.fill("#error-code", "")
    page.fill("#stop-reason", "final_answer")
    page.fill("#min-reward", "1")
    page.click("#apply")
    expect(page.locator("#status")).to_contain_text("all scanned")
    expect(rows).to_have_count(1)  # served requests carry no reference answer (reward 0): the compacted episode
    expect(rows.first).to_contain_text("reward 1 · final_answer")
    expect(rows.first).to_contain_text("1 compaction(s)")
    page.fill("#min-reward", "")
    page.fill("#stop-reason", "")
    page.click("#apply")
    expect(rows).to_have_count(total)
    page.close()


def test_the_same_task_under_two_checkpoints_side_by_side(browser: Browser, viewer: LiveServer) -> None:
    page = open_viewer(browser, viewer)
    page.locator("#list li .same-task").first.click()
    expect(page.locator("#task-filter")).to_be_visible()
    rows = page.locator("#list li")
    expect(rows).to_have_count(4)  # a_calc, step 10, step 20, e_masked
    expect(rows.nth(1)).to_contain_text("step 10")
    rows.nth(1).click()
    rows.nth(2).locator(".compare").click()
    expect(page.locator("#right")).to_be_visible()
    expect(page.locator("#left h2")).to_contain_text("step 10")
    expect(page.locator("#right h2")).to_contain_text("step 20")
    assert drawn_tokens(page, "left", 0) == drawn_tokens(page, "right", 0)  # the same scripted policy
    page.click("#clear-task")
    expect(page.locator("#task-filter")).to_be_hidden()
    page.close()


def test_a_large_file_loads_a_page_at_a_time_and_reports_malformed_lines(
    browser: Browser, big: Path, tokenizer: HFTokenizer
) -> None:
    server = LiveServer(create_viewer_app(big, tokenizer=tokenizer)).start()
    try:
        page = open_viewer(browser, server, "?page_size=25")
        rows = page.locator("#list li")
        expect(rows).to_have_count(25)
        expect(page.locator("#status")).to_contain_text("indexed so far")
        for shown in (50, 75, 100, 120):  # scrolling to the list's end fetches the next page
            page.eval_on_selector("#sidebar", "sidebar => { sidebar.scrollTop = sidebar.scrollHeight; }")
            expect(rows).to_have_count(shown)
        expect(page.locator("#more")).to_be_hidden()
        expect(page.locator("#status")).to_contain_text("all scanned")
        expect(page.locator("#malformed")).to_contain_text(
            "3 malformed line(s) skipped: many.jsonl:5, many.jsonl:46, many.jsonl:87"
        )
        page.close()
    finally:
        server.stop()


def test_the_chat_page_links_to_its_servers_log(browser: Browser, start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(trajectory_log=str(tmp_path / "served.jsonl"))
    page = browser.new_page()
    page.goto(server.url)
    page.fill("#input", "What is 17 * 23?")
    page.click("#send")
    expect(page.locator(".msg.assistant")).to_have_text("The answer is 391.")
    page.click("#viewer-link")
    expect(page.locator("#source")).to_contain_text("served model calculator-agent · its trajectory log")
    expect(page.locator("#chat-link")).to_be_visible()
    row = page.locator("#list li")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("What is 17 * 23?")
    row.click()
    expect(page.locator("#left .tool-call")).to_contain_text('calculator({"expression":"17 * 23"})')
    page.close()
    plain = browser.new_page()
    plain.goto(start_server().url)  # no log: no link
    expect(plain.locator("#model")).to_contain_text("calculator-agent")
    expect(plain.locator("#viewer-link")).to_be_hidden()
    plain.close()
