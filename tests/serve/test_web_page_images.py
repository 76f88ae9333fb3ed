"""The web chat page with images, in a real headless Chromium (Debian's `chromium`, driven by Playwright, as
`test_web_page.py`): attach a PNG (the file button, or a paste), send it, see its thumbnail in the user's message
and the reply that counted its pads; ask for a zoom and see the images the tool returned under its result. A
text-only server offers no attach button.

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
from agent_runtime import ScriptedEngine
from tests.agent_protocol.families.test_qwen3_vl import png
from tests.serve.conftest import LiveServer, ServerFactory
from tests.serve.test_serve_images import GRID, vision_policy, vision_recipe
from tests.serve.test_web_page import chromium  # skips this module too where the browser is missing


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def server(
    start_server: ServerFactory, qwen3_tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> LiveServer:
    plain = HFTokenizer.from_file(qwen3_tokenizer_file)
    tokenizer = HFTokenizer(plain.backend, source=plain.source, vision=GRID)
    engine = ScriptedEngine(tokenizer, policy=vision_policy(tokenizer))
    return start_server(engine=engine, recipe=vision_recipe(tmp_path_factory.mktemp("zoom")))


def open_page(browser: Browser, server: LiveServer) -> Page:
    page = browser.new_page()
    page.goto(server.url)
    expect(page.locator("#model")).to_contain_text("vision-agent")
    expect(page.locator("#attach")).to_be_visible()
    return page


def attach_png(page: Page, width: int, height: int) -> None:
    page.set_input_files("#image-input", {"name": "picture.png", "mimeType": "image/png", "buffer": png(width, height)})


def test_an_attached_image_is_sent_and_shown(browser: Browser, server: LiveServer) -> None:
    page = open_page(browser, server)
    attach_png(page, 300, 200)
    expect(page.locator("#attachments img.thumb")).to_have_count(1)
    page.fill("#input", "What is in this picture?")
    page.click("#send")

    thumb = page.locator(".msg.user img.thumb")
    expect(thumb).to_have_count(1)
    assert thumb.get_attribute("src") == "data:image/png;base64," + base64.b64encode(png(300, 200)).decode()
    expect(page.locator(".msg.user")).to_contain_text("What is in this picture?")
    expect(page.locator(".msg.assistant")).to_have_text(f"I see 1 image(s) in {GRID.pads(300, 200)} pads.")
    expect(page.locator("#attachments")).to_be_hidden()

    # the next turn resends the image with the history: the model still sees it
    page.fill("#input", "And now?")
    page.press("#input", "Enter")
    expect(page.locator(".msg.assistant").nth(1)).to_have_text(f"I see 1 image(s) in {GRID.pads(300, 200)} pads.")
    page.close()


def test_a_pasted_image_and_the_images_a_tool_returned(browser: Browser, server: LiveServer) -> None:
    page = open_page(browser, server)
    data = list(png(100, 100))
    page.evaluate(
        """(bytes) => {
            const transfer = new DataTransfer();
            transfer.items.add(new File([new Uint8Array(bytes)], "pasted.png", { type: "image/png" }));
            const input = document.getElementById("input");
            const paste = new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true });
            input.dispatchEvent(paste);
        }""",
        data,
    )
    expect(page.locator("#attachments img.thumb")).to_have_count(1)
    page.fill("#input", "Zoom into this.")
    page.click("#send")

    expect(page.locator(".event.tool-call")).to_contain_text("zoom")
    result = page.locator(".event.tool-result")
    expect(result).to_contain_text("zoomed in 2x")
    expect(result.locator("img.thumb")).to_have_count(2)
    sources: list[Any] = [result.locator("img.thumb").nth(i).get_attribute("src") for i in range(2)]
    assert all(isinstance(s, str) and s.startswith("data:image/png;base64,") for s in sources)
    pads = GRID.pads(100, 100) + GRID.pads(56, 28) + GRID.pads(28, 84)
    expect(page.locator(".msg.assistant")).to_have_text(f"The zoom showed 3 images in {pads} pads.")
    page.close()


def test_a_refused_image_shows_the_servers_error(browser: Browser, server: LiveServer) -> None:
    page = open_page(browser, server)
    attach_png(page, 2, 500)  # an aspect ratio the model's image grid does not take
    expect(page.locator("#attachments img.thumb")).to_have_count(1)
    page.fill("#input", "<i>look</i>")
    page.click("#send")
    expect(page.locator(".event.error")).to_contain_text("messages[0].content[0]")
    expect(page.locator(".event.error")).to_contain_text("aspect ratio")
    expect(page.locator(".msg.user")).to_contain_text("<i>look</i>")  # text stays text
    expect(page.locator(".msg.user i")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
    page.close()


def test_a_text_only_server_offers_no_attach_button(browser: Browser, start_server: ServerFactory) -> None:
    server = start_server()  # the calculator recipe: the qwen3 protocol, text only
    page = browser.new_page()
    page.goto(server.url)
    expect(page.locator("#model")).to_contain_text("calculator-agent")
    expect(page.locator("#attach")).to_be_hidden()
    page.close()
