"""The operator page in a real browser (Debian's headless chromium, driven by Playwright): an
admin signs in, sees the pools, deployments and replicas of the running stack and its job
topics' lag, sends a few requests and sees the counters move, sees a batch in progress (on a
pool without workers, so it stays there until cancelled); a team key is turned away. Saves a
screenshot (set `LLMQ_ADMIN_SCREENSHOT` to keep it, as the README's)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.e2e.conftest import ADMIN_KEY, IDLE_MODEL, Stack
from tests.e2e.test_batches import jsonl, submit

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
# As root, on a closed network: no sandbox, no background connections that would be refused.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make install` (as root)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def sign_in(browser: Browser, stack: Stack, key: str) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{stack.base_url}/admin")
    page.fill("#admin-key", key)
    page.click("#sign-in")
    return page


def ok_count(page: Page, model: str) -> int:
    return int(page.text_content(f'tr.deployment[data-model="{model}"] td.requests-ok') or 0)


def test_an_admin_sees_the_fleet_and_the_counters_move(
    browser: Browser, stack: Stack, tmp_path: Path
) -> None:
    page = sign_in(browser, stack, ADMIN_KEY)
    row = f'section.pool[data-pool="{stack.pool}"] tr.deployment[data-model="{stack.model}"]'
    page.wait_for_selector(row, timeout=15_000)
    page.wait_for_selector(f'section.pool[data-pool="{stack.pool}"] tr.replica', timeout=15_000)
    assert "ready" in (
        page.text_content(f'section.pool[data-pool="{stack.pool}"] tr.replica') or ""
    )
    before = ok_count(page, stack.model)
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key)
    for _ in range(2):
        client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    cell = f"{row} td.requests-ok"
    page.wait_for_function(
        "([cell, before]) => Number(document.querySelector(cell).textContent) >= before + 2",
        arg=[cell, before],
        timeout=15_000,
    )
    assert "ms /" in (page.text_content(row) or "")  # a TTFT p95 against the SLO
    # The job topics' lag, once the gateway's topic watcher has looked (every 5 s).
    title = f'section.pool[data-pool="{stack.pool}"] h2'
    page.wait_for_function(
        "(title) => 'interactive' in JSON.parse(document.querySelector(title).dataset.lag)",
        arg=title,
        timeout=15_000,
    )
    assert "job-topic lag: " in (page.text_content(title) or "")
    assert "on the topic" in (page.text_content("#dead-title") or "")
    waiting = submit(client, jsonl(3, IDLE_MODEL), "admin-page.jsonl")
    try:
        page.wait_for_selector(f'tr.batch[data-batch="{waiting.id}"]', timeout=15_000)
        shown = page.text_content(f'tr.batch[data-batch="{waiting.id}"]') or ""
        assert IDLE_MODEL in shown and "e2e" in shown  # its model and its team
        shot = tmp_path / "admin.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        if keep := os.environ.get("LLMQ_ADMIN_SCREENSHOT"):
            shutil.copyfile(shot, keep)
    finally:
        client.batches.cancel(waiting.id)
    page.close()


def test_a_team_key_is_turned_away(browser: Browser, stack: Stack) -> None:
    page = sign_in(browser, stack, stack.api_key)
    page.wait_for_function("document.getElementById('error').textContent.length > 0")
    assert "not an admin key" in (page.text_content("#error") or "")
    assert page.query_selector("section.pool") is None
    page.close()
