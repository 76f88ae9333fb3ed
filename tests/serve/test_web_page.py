"""The web chat page in a real headless Chromium (Debian's `chromium`, driven by Playwright): type a question,
see the tool call with its arguments, the tool result and the answer appear.

CI installs the browser (`.ci/run`) and sets AGENT_SERVE_REQUIRE_CHROMIUM=1, so there a missing browser fails the
test; elsewhere it is skipped with the reason. Playwright's own browser download is never used.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.serve.conftest import LiveServer, ServerFactory

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not CHROMIUM.exists():
    if os.environ.get("AGENT_SERVE_REQUIRE_CHROMIUM") == "1":
        raise RuntimeError(f"{CHROMIUM} is missing; install Debian's chromium (`apt-get install -y chromium`)")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)

from playwright.sync_api import Browser, expect, sync_playwright  # noqa: E402


@contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Chromium as every page test drives it (their `browser` fixtures open it here)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def server(start_server: ServerFactory) -> LiveServer:
    return start_server()


def test_the_page_shows_the_tool_call_and_the_answer(browser: Browser, server: LiveServer) -> None:
    page = browser.new_page()
    page.goto(server.url)
    expect(page.locator("#model")).to_contain_text("calculator-agent")
    page.fill("#input", "What is 17 * 23?")
    page.click("#send")

    call = page.locator(".event.tool-call")
    expect(call).to_have_count(1)
    expect(call).to_contain_text("calculator")
    expect(call).to_contain_text('"expression": "17 * 23"')
    expect(page.locator(".event.tool-result")).to_contain_text("391")
    expect(page.locator(".msg.assistant")).to_have_text("The answer is 391.")

    # a second turn in the same conversation, sent with Enter
    page.fill("#input", "And what is 5 + 6?")
    page.press("#input", "Enter")
    expect(page.locator(".msg.assistant")).to_have_count(2)
    expect(page.locator(".msg.assistant").nth(1)).to_have_text("The answer is 11.")
    expect(page.locator(".event.tool-call")).to_have_count(2)
    page.close()


def test_the_page_shows_an_engine_failure(browser: Browser, server: LiveServer) -> None:
    page = browser.new_page()
    page.goto(server.url)
    page.fill("#input", "What is 6 * 7? Then explode.")
    page.click("#send")
    expect(page.locator(".event.tool-call")).to_have_count(1)
    expect(page.locator(".event.error")).to_have_count(1)
    expect(page.locator(".event.error")).to_contain_text("failed on purpose")
    expect(page.locator(".msg.assistant")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
    page.close()
