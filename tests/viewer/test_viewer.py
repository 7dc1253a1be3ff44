"""`rlhfkit view`: finding runs, the JSON it serves, and the page in a headless Chromium."""

from __future__ import annotations

import json
import math
import struct
import urllib.request
import zlib
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlhfkit.config.pages import ViewConfig
from rlhfkit.config.parse import parse_config
from rlhfkit.errors import UserError
from rlhfkit.viewer.app import ViewerApp
from rlhfkit.viewer.runs import find_runs, image_file
from rlhfkit.web.server import Server
from tests.helpers import write_jsonl
from tests.web.browser import console_errors

METRICS = ("reward/score", "kl/ref", "loss/policy", "response/length")
XSS = "<img src=x onerror=\"window.__pwned = 'report'\">"


def png(width: int = 4, height: int = 3) -> bytes:
    """A small valid PNG (a blue rectangle)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x30\x70\xd0" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def write_run(path: Path, kl_coef: float, steps: int = 30) -> Path:
    path.mkdir(parents=True)
    rows = []
    for step in range(1, steps + 1):
        score = math.log1p(step) * (1.6 if kl_coef == 0 else 1.0)
        kl = step * (0.9 if kl_coef == 0 else 0.08)
        rows.append(
            {
                "step": step,
                "reward/score": score,
                "kl/ref": kl,
                "loss/policy": 1 / step,
                "response/length": 20 + step % 5,
            }
        )
    rows.append({"step": steps, "eval/gold": 1.5 - kl_coef})  # a metric logged once
    write_jsonl(path / "metrics.jsonl", rows)
    samples = [
        {
            "step": s,
            "prompt": f"Customer: my order {i} is late.\nAgent:",
            "response": f" sorry, order {i} ships today",
            "score": 0.1 * s,
        }
        for s in (10, 20, 30)
        for i in range(3)
    ]
    write_jsonl(path / "samples.jsonl", samples)
    (path / "metrics.jsonl").open("a").write('{"step": 31, "reward/sc')  # a line still being written
    return path


@pytest.fixture
def demo_dir(tmp_path) -> Path:
    root = tmp_path / "demo"
    write_run(root / "ppo", kl_coef=0.1)
    write_run(root / "ppo_nokl", kl_coef=0.0)
    (root / "plots").mkdir()
    (root / "plots" / "reward.png").write_bytes(png())
    (root / "report.md").write_text(
        f"# Demo report\n\n| model | gold |\n|---|---|\n| PPO | 1.9 |\n\n![reward](plots/reward.png)\n\n{XSS}\n"
    )
    return root


def test_runs_are_found_in_a_folder_of_runs_and_errors_name_the_folder(demo_dir, tmp_path):
    folders = find_runs([str(demo_dir), str(demo_dir / "ppo")])
    assert [r.name for r in folders[0].runs] == ["demo/ppo", "demo/ppo_nokl"]
    assert [r.name for r in folders[1].runs] == ["ppo"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty: no metrics.jsonl"):
        find_runs([str(tmp_path / "empty")])
    with pytest.raises(UserError, match="nope: no such run folder"):
        find_runs([str(tmp_path / "nope")])
    assert image_file(demo_dir, "plots/reward.png") is not None
    assert (
        image_file(demo_dir, "../demo/ppo/metrics.jsonl") is None
        and image_file(demo_dir / "ppo", "../plots/reward.png") is None
    )


def test_run_folders_are_arguments_or_flags():
    cfg, _ = parse_config("rlhfkit view", ViewConfig, ["runs/a", "--port", "0", "runs/b", "--runs", "runs/c"])
    assert sorted(cfg.runs) == ["runs/a", "runs/b", "runs/c"] and cfg.serve.port == 0
    with pytest.raises(UserError, match="at least one run folder"):
        parse_config("rlhfkit view", ViewConfig, [])


@contextmanager
def served_json(folders: list[str]):
    """`rlhfkit view FOLDERS` in this process; yields get(path) -> the JSON (or, for "/", the HTML) served."""
    server = Server(ViewerApp(find_runs(folders)).app, "127.0.0.1", 0).start()

    def get(path: str):
        body = urllib.request.urlopen(server.url(path)).read().decode()
        return body if path == "/" else json.loads(body)

    try:
        yield get
    finally:
        server.stop()


@pytest.fixture
def viewer(demo_dir):
    server = Server(ViewerApp(find_runs([str(demo_dir)])).app, "127.0.0.1", 0).start()
    yield server
    server.stop()


def test_the_api_serves_every_metric_and_sample_and_only_images_from_the_folders(viewer):
    runs = json.load(urllib.request.urlopen(viewer.url("/api/metrics")))["runs"]
    assert [r["name"] for r in runs] == ["demo/ppo", "demo/ppo_nokl"]
    assert len(runs[0]["rows"]) == 31 and set(runs[0]["rows"][0]) == {"step", *METRICS}
    samples = json.load(urllib.request.urlopen(viewer.url("/api/samples")))["runs"]
    assert len(samples[1]["rows"]) == 9
    assert urllib.request.urlopen(viewer.url("/file/0/plots/reward.png")).read() == png()
    for bad in ("/file/0/ppo/metrics.jsonl", "/file/0/..%2F..%2Fetc%2Fpasswd", "/file/9/plots/reward.png"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(viewer.url(bad))
        assert err.value.code == 404


def test_the_page_draws_every_metric_with_the_runs_overlaid(browser, viewer, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    console_errors(browser)  # forget what earlier pages logged
    browser.get(viewer.url("/"))
    wait = WebDriverWait(browser, 10, poll_frequency=0.05)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".chart")) == len(METRICS) + 1)
    for metric in METRICS:
        lines = browser.find_elements(By.CSS_SELECTOR, f'.chart[data-metric="{metric}"] path.line')
        assert sorted(line.get_attribute("data-run") for line in lines) == ["demo/ppo", "demo/ppo_nokl"]
        assert all(line.get_attribute("d").count("L") == 29 for line in lines)  # 30 steps each
    # a metric logged once is a dot per run
    assert (
        len(browser.find_elements(By.CSS_SELECTOR, '.chart[data-metric="eval/gold"] circle.dot:not([visibility])')) == 2
    )
    legend = browser.find_elements(By.CSS_SELECTOR, ".legend-item")
    assert [item.text for item in legend] == ["demo/ppo", "demo/ppo_nokl"]
    legend[1].click()  # hide a run
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, '.chart[data-metric="kl/ref"] path.line')) == 1)
    legend = browser.find_elements(By.CSS_SELECTOR, ".legend-item")
    legend[1].click()
    browser.find_element(By.ID, "filter").send_keys("kl")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".chart")) == 1)
    browser.find_element(By.ID, "filter").clear()
    browser.find_element(By.ID, "filter").send_keys(" ")

    # against KL: each metric over the KL of its row (the over-optimisation curve); the run without the penalty
    # reaches a KL of 27 in 30 steps: x ticks every 10 up to 20, rather than every 5 up to step 30
    def x_ticks(metric: str) -> list[str]:
        chart = f'.chart[data-metric="{metric}"]'
        return [t.text for t in browser.find_elements(By.CSS_SELECTOR, f'{chart} text.tick[text-anchor="middle"]')]

    assert x_ticks("reward/score")[-1] == "30"
    Select(browser.find_element(By.ID, "x-axis")).select_by_value("kl/ref")
    wait.until(lambda d: x_ticks("reward/score") and x_ticks("reward/score")[-1] == "20")
    # a metric logged in a row without a KL has no point on that axis
    assert browser.find_elements(By.CSS_SELECTOR, '.chart[data-metric="eval/gold"] circle.dot:not([visibility])') == []
    Select(browser.find_element(By.ID, "x-axis")).select_by_value("step")
    wait.until(lambda d: x_ticks("reward/score")[-1] == "30")

    browser.find_element(By.CSS_SELECTOR, '[data-testid="tab-samples"]').click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".sample")) == 3)
    assert "step 30" in browser.find_element(By.ID, "sample-count").text
    assert browser.find_elements(By.CSS_SELECTOR, ".sample-response")[0].text.strip() == "sorry, order 0 ships today"

    browser.find_element(By.CSS_SELECTOR, '[data-testid="tab-report"]').click()
    report = browser.find_element(By.CSS_SELECTOR, ".report")
    assert report.find_element(By.TAG_NAME, "th").text == "model"
    image = report.find_element(By.TAG_NAME, "img")
    wait.until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image) == 4)
    assert XSS in report.text and browser.execute_script("return window.__pwned === undefined")
    assert console_errors(browser) == []


def test_opening_a_tab_by_its_url_keeps_the_header_at_the_top(browser, viewer, demo_dir):
    """`/#report` opens the report tab scrolled to the top: the header bar first, the report's first line below
    it, with no band of page above the header (a fragment that named an element would scroll to it)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    paragraphs = "\n\n".join(f"Paragraph {i} of a report longer than the window." for i in range(80))
    with (demo_dir / "report.md").open("a") as report:
        report.write(f"\n{paragraphs}\n")
    browser.get(viewer.url("/") + "#report")
    wait = WebDriverWait(browser, 10, poll_frequency=0.05)
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".report").is_displayed())
    tab = browser.find_element(By.CSS_SELECTOR, '[data-testid="tab-report"]')
    assert tab.get_attribute("aria-selected") == "true"
    page = browser.execute_script(
        """const bar = document.querySelector("header.bar").getBoundingClientRect();
        const first = document.querySelector(".report-path").getBoundingClientRect();
        return {scrolled: window.scrollY, height: document.documentElement.scrollHeight, window: window.innerHeight,
                barTop: bar.top, barBottom: bar.bottom, firstTop: first.top,
                namedByTabs: ["curves", "samples", "report"].filter((name) => document.getElementById(name))};"""
    )
    assert page["height"] > page["window"] + 500  # the page could scroll
    assert page["scrolled"] == 0 and page["barTop"] == 0, page
    assert page["firstTop"] >= page["barBottom"], page  # the report's first line is not under the header
    assert page["namedByTabs"] == [], page
