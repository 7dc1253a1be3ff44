"""The screenshots of docs/labelling.md, taken in the headless Chromium the tests use:

    python -m tests.web.screenshots docs/images

writes label-page.png (the labelling page), label-done.png (the done card) and view-curves.png (the run
viewer on two made-up PPO runs, with and without the KL penalty).
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import write_jsonl
from tests.labelling.label_helpers import serve
from tests.web.browser import screenshot, start_browser

PROMPTS = [
    (
        "Customer: Hi, I ordered a kettle two weeks ago (order #48213) and it still hasn't arrived. "
        "The tracking page hasn't changed since last Monday. Can you help?\nAgent:",
        [
            "I'm sorry your kettle hasn't arrived yet. I've checked order #48213: the parcel was held at the "
            "regional depot after a scanning error. I've asked the carrier to release it today, so it should "
            "reach you within two working days. If it hasn't arrived by Friday, reply here and I'll send a "
            "replacement straight away.",
            "Orders usually take 5-10 days. Please wait a few more days and check the tracking page again.",
        ],
    ),
    (
        "Customer: I was charged twice for my subscription this month.\nAgent:",
        [
            "Sorry about the double charge. I can see two payments on the 3rd; I've refunded the second one, "
            "and you should see it back on your card in 3-5 days.",
            "I have refunded the duplicate payment.",
        ],
    ),
]


def metrics_rows(kl_coef: float, steps: int, rng: random.Random) -> list[dict]:
    rows = []
    for step in range(1, steps + 1):
        t = step / steps
        drift = 2.6 if kl_coef == 0 else 1.0
        score = 0.1 + drift * (1 - math.exp(-3 * t)) + rng.gauss(0, 0.06)
        kl = (40 * t**1.6 if kl_coef == 0 else 3.0 * (1 - math.exp(-4 * t))) + abs(rng.gauss(0, 0.1))
        gold = 1.7 + (0.3 * t if kl_coef else 1.2 * t - 5.0 * t**2) + rng.gauss(0, 0.05)
        rows.append(
            {
                "step": step,
                "reward/score": score,
                "reward/total": score - kl_coef * kl,
                "reward/gold": gold,
                "kl/ref": kl,
                "kl/coef": kl_coef,
                "policy/entropy": 2.2 - (1.6 if kl_coef == 0 else 0.5) * t + rng.gauss(0, 0.03),
                "policy/clipfrac": max(0.0, 0.08 + rng.gauss(0, 0.02)),
                "loss/value": 0.8 * math.exp(-3 * t) + abs(rng.gauss(0, 0.03)),
                "response/length": 24 + (10 if kl_coef == 0 else 2) * t + rng.gauss(0, 0.8),
            }
        )
    return rows


def label_pages(driver, out: Path, work: Path) -> None:
    rows = [{"prompt": p, "responses": r} for p, r in PROMPTS] * 3
    (work / "guidelines.md").write_text("# Guidelines\n\nPrefer the reply that solves the customer's problem.\n")
    running = serve(work, rows, "--annotators", "alice", "--guidelines", str(work / "guidelines.md"))
    try:
        driver.get(running.url("alice"))
        time.sleep(0.5)
        for _ in range(2):
            driver.find_element("css selector", '[data-testid="choose-a"]').click()
            time.sleep(0.3)
        driver.find_element("css selector", '[data-testid="strength-clearly"]').click()
        time.sleep(0.2)
        screenshot(driver, out / "label-page.png")
        while not driver.find_element("css selector", '[data-testid="done"]').is_displayed():
            driver.find_element("css selector", '[data-testid="choose-b"]').click()
            time.sleep(0.25)
        screenshot(driver, out / "label-done.png")
    finally:
        running.stop()


def viewer_page(driver, out: Path, work: Path) -> None:
    from rlhfkit.viewer.app import ViewerApp
    from rlhfkit.viewer.runs import find_runs
    from rlhfkit.web.server import Server

    rng = random.Random(0)
    for name, kl_coef in (("ppo", 0.1), ("ppo_nokl", 0.0)):
        (work / "demo" / name).mkdir(parents=True)
        write_jsonl(work / "demo" / name / "metrics.jsonl", metrics_rows(kl_coef, 120, rng))
    server = Server(ViewerApp(find_runs([str(work / "demo")])).app, "127.0.0.1", 0).start()
    try:
        driver.set_window_size(1280, 1000)
        driver.get(server.url("/"))
        time.sleep(1.0)
        screenshot(driver, out / "view-curves.png")
    finally:
        server.stop()


def main(out: Path) -> None:
    driver = start_browser(1280, 860)
    try:
        with tempfile.TemporaryDirectory() as work:
            label_pages(driver, out, Path(work))
            viewer_page(driver, out, Path(work))
    finally:
        driver.quit()
    print(f"wrote {', '.join(p.name for p in sorted(out.glob('*.png')))} to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images"))
