"""The browser playground at `/`, driven in headless Chromium (Debian's, through playwright)
against a real `srt-serve` on a tiny model."""

from __future__ import annotations

import json
import re
import shutil
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect, sync_playwright

from srt.managers.request_times import STAGES
from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
MAX_TOKENS = 12
VIEWPORT: ViewportSize = {"width": 1200, "height": 800}
MILLISECONDS = re.compile(r"^\d+ ms$")
# What the page shows where it has no figure: an en dash.
NO_FIGURE = "\u2013"
# A rate, or no figure when every token arrived at once (nothing to divide by: a fast server's
# few tokens may reach the browser in one read).
RATE_OR_NONE = re.compile(rf"^(\d+\.\d|{NO_FIGURE})$")


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (scripts/test.sh installs it)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    page = browser.new_page(viewport=VIEWPORT)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(server.url + "/")
    expect(page.locator("#model")).to_have_text(model_name(server))
    yield page
    page.close()
    assert not errors, f"the page raised: {errors}"


def post_json(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of a POST, error statuses included."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def model_name(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as response:
        name: str = json.load(response)["data"][0]["id"]
        return name


def chat(
    server: ServerProcess, messages: list[dict[str, str]], max_tokens: int = MAX_TOKENS
) -> tuple[int, dict[str, Any]]:
    """The non-streamed answer to what the page sends with temperature 0."""
    body = {
        "model": model_name(server),
        "messages": messages,
        "temperature": 0,
        "top_p": 1,
        "max_tokens": max_tokens,
    }
    return post_json(server.url + "/v1/chat/completions", body)


def ask(page: Page, question: str) -> str:
    """Types a question, sends it, and returns the streamed answer once the stream ended."""
    page.fill("#prompt", question)
    page.click("#send")
    expect(page.locator("#stop")).to_be_disabled()
    expect(page.locator("#send")).to_be_enabled()
    return page.locator("#answer").text_content() or ""


def test_a_typed_question_streams_the_greedy_answer(page: Page, server: ServerProcess) -> None:
    page.fill("#temperature", "0")
    page.fill("#max-tokens", str(MAX_TOKENS))
    messages = []
    for question in ("What is the capital of France?", "And of Italy?"):
        answer = ask(page, question)
        messages.append({"role": "user", "content": question})
        status, expected = chat(server, messages)
        assert status == 200, expected
        assert answer, "no streamed text reached the page"
        assert answer == expected["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": answer})
        expect(page.locator("#ttft")).to_have_text(MILLISECONDS)
        tokens = expected["usage"]["completion_tokens"]
        expect(page.locator("#tokens")).to_have_text(str(tokens))
        if tokens > 1:
            expect(page.locator("#tps")).to_have_text(RATE_OR_NONE)
    expect(page.locator("#conversation .message")).to_have_count(4)
    expect(page.locator("#error")).to_be_empty()


def test_the_last_answer_shows_where_its_time_went(page: Page) -> None:
    """The server's stage breakdown of the page's own last answer (`/request_times/{id}`)."""
    page.fill("#max-tokens", "4")
    ask(page, "Where does the time go?")
    stages = page.locator("#stages dt")
    expect(stages).to_have_text(list(STAGES))
    for value in page.locator("#stages dd").all_text_contents():
        assert re.fullmatch(r"\d+\.\d ms", value), value
    page.click("#clear")
    expect(stages).to_have_text([NO_FIGURE])


def test_the_decode_rate_counts_the_tokens_after_the_first(page: Page) -> None:
    """The page's rate: (tokens - 1) over the seconds from the first token to the last; a dash
    when there is no interval to measure."""
    rate = "([tokens, first, last]) => formatRate(tokens, first, last)"
    assert page.evaluate(rate, [5, 1000, 3000]) == "2.0"
    assert page.evaluate(rate, [12, 250.0, 361.5]) == "98.7"
    assert page.evaluate(rate, [1, 1000, 3000]) == NO_FIGURE
    assert page.evaluate(rate, [5, 1000, 1000]) == NO_FIGURE


def test_a_refused_request_shows_the_servers_error_and_keeps_the_prompt(
    page: Page, server: ServerProcess
) -> None:
    question, too_many = "Too long an answer", 1_000_000
    status, refusal = chat(server, [{"role": "user", "content": question}], too_many)
    assert status == 400, refusal
    page.fill("#max-tokens", str(too_many))
    page.fill("#prompt", question)
    page.click("#send")
    expect(page.locator("#error")).to_have_text(f"HTTP 400: {refusal['error']['message']}")
    expect(page.locator("#prompt")).to_have_value(question)
    expect(page.locator("#conversation .message")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()


def test_the_page_renders_with_its_own_style(page: Page, tmp_path: Path) -> None:
    # The inline style and script run only when the Content-Security-Policy hashes match them.
    send_background = page.locator("#send").evaluate("e => getComputedStyle(e).backgroundColor")
    assert send_background not in ("rgba(0, 0, 0, 0)", "rgb(239, 239, 239)")
    for selector in ("#prompt", "#send", "#temperature", "#top-p", "#max-tokens", "#api-key"):
        expect(page.locator(selector)).to_be_visible()
    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width == VIEWPORT["width"]
    assert height >= VIEWPORT["height"]


def test_the_page_is_served_with_a_strict_content_security_policy(server: ServerProcess) -> None:
    with urllib.request.urlopen(server.url + "/", timeout=10) as response:
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        policy = response.headers["Content-Security-Policy"]
        page = response.read().decode()
    assert "default-src 'none'" in policy
    assert "'unsafe-inline'" not in policy
    assert "connect-src 'self'" in policy
    # Self-contained: nothing is fetched from elsewhere.
    assert "http://" not in page
    assert "https://" not in page
