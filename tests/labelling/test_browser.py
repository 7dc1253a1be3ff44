"""The labelling page in a real headless Chromium: clicks, keys, undo, strength, progress, the done page,
two annotators per pair, the export read by `rlhfkit rm`, and model text that tries to run script."""

from __future__ import annotations

import json

import pytest

from rlhfkit.cli.main import main
from tests.helpers import metrics, read_jsonl
from tests.web.browser import console_errors

from .label_helpers import XSS_IMG, XSS_SCRIPT, candidate_rows, serve

pytestmark = pytest.mark.usefixtures("browser")


def by_testid(driver, name):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')


def wait_until(driver, condition, timeout=10):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(d))


def wait_progress(driver, done, total):
    wait_until(driver, lambda d: by_testid(d, "progress").text == f"{done} / {total} labelled")


def press(driver, key):
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(key).perform()


def shown(driver) -> tuple[str, str, str]:
    return tuple(by_testid(driver, n).text for n in ("prompt", "response-a", "response-b"))


def open_page(driver, url):
    console_errors(driver)  # forget what earlier pages logged
    driver.get(url)
    wait_until(driver, lambda d: "labelled" in by_testid(d, "progress").text)


def test_label_by_click_and_keyboard_with_undo_tie_strength_progress_and_done(browser, tmp_path):
    running = serve(tmp_path, candidate_rows(5), "--annotators", "alice")
    try:
        open_page(browser, running.url("alice"))
        wait_progress(browser, 0, 5)
        assert not by_testid(browser, "done").is_displayed()
        # 1. a strength, then "A is better" by click
        first = shown(browser)
        by_testid(browser, "strength-much").click()
        by_testid(browser, "choose-a").click()
        wait_progress(browser, 1, 5)
        assert shown(browser) != first
        # 2. "B is better" by key, then undo by key: the same pair, the same sides, comes back
        second = shown(browser)
        press(browser, "2")
        wait_progress(browser, 2, 5)
        press(browser, "u")
        wait_progress(browser, 1, 5)
        assert shown(browser) == second
        # 3. tie by key, both bad by click, skip by key, then "A" by key on the last pair
        press(browser, "3")
        wait_progress(browser, 2, 5)
        by_testid(browser, "choose-both-bad").click()
        wait_progress(browser, 3, 5)
        press(browser, "s")
        wait_progress(browser, 4, 5)
        last = shown(browser)
        press(browser, "1")
        wait_until(browser, lambda d: by_testid(d, "done").is_displayed())
        assert by_testid(browser, "progress").text == "5 / 5 labelled"
        assert not by_testid(browser, "choose-a").is_displayed()
        assert console_errors(browser) == []
        live = [(j.choice, j.strength) for j in running.store.judgments()]
        everything = [j.choice for j in running.store.judgments(include_undone=True)]
    finally:
        running.stop()

    assert live == [("a", "much"), ("tie", None), ("both_bad", None), ("skip", None), ("a", None)]
    assert everything.count("b") == 1  # the withdrawn answer is kept, marked undone
    assert main(["label", "--output-dir", str(tmp_path / "out"), "--export"]) == 0
    prefs = read_jsonl(tmp_path / "out" / "prefs.jsonl")
    assert [(r["prompt"], r["chosen"], r["rejected"], r.get("margin")) for r in prefs] == [
        (first[0], first[1], first[2], 1.0),  # strength "much" -> margin 1.0
        (last[0], last[1], last[2], None),
    ]
    ties = read_jsonl(tmp_path / "out" / "ties.jsonl")
    assert sorted(t["label"] for t in ties) == ["both_bad", "tie"]


def test_two_annotators_label_each_pair_then_the_export_trains_a_reward_model(browser, tmp_path, tiny_model_dir):
    running = serve(tmp_path, candidate_rows(6), "--annotators", "alice,bob", "--labels-per-item", "2")
    left_wins = 0
    try:
        for name in ("alice", "bob"):
            open_page(browser, running.url(name))
            for done in range(6):
                wait_progress(browser, done, 6)
                _, a, _ = shown(browser)
                left_wins += "thanks" in a
                press(browser, "1" if "thanks" in a else "2")  # both prefer the polite reply
            wait_until(browser, lambda d: by_testid(d, "done").is_displayed())
            assert console_errors(browser) == []
    finally:
        running.stop()

    out = tmp_path / "out"
    assert main(["label", "--output-dir", str(out), "--export"]) == 0
    prefs = read_jsonl(out / "prefs.jsonl")
    assert len(prefs) == 12 and all("thanks" in r["chosen"] and "thanks" not in r["rejected"] for r in prefs)
    assert sorted(r["annotator"] for r in prefs) == ["alice"] * 6 + ["bob"] * 6
    report = json.loads((out / "agreement.json").read_text())
    assert report["complete_pairs"] == 6 and report["agreement"]["mean_pair_agreement"] == 1.0
    assert report["agreement"]["cohen_kappa"]["alice/bob"]["shared_pairs"] == 6
    assert report["position_bias"]["left_wins"] == left_wins
    assert report["annotators"]["bob"]["labels"] == 6

    rm_out = tmp_path / "rm"
    flags = ["--max-steps", "3", "--batch-size", "4", "--progress", "false", "--learning-rate", "1e-3"]
    assert (
        main(
            [
                "rm",
                "--model",
                str(tiny_model_dir),
                "--data",
                str(out / "prefs.jsonl"),
                "--output-dir",
                str(rm_out),
                *flags,
            ]
        )
        == 0
    )
    assert len(metrics(rm_out)) == 3 and (rm_out / "config.json").is_file()


def test_model_text_that_tries_to_run_script_is_shown_as_text(browser, tmp_path):
    from selenium.webdriver.common.by import By

    rows = [
        {"prompt": XSS_SCRIPT, "responses": [XSS_IMG, f"{XSS_SCRIPT} and more"]},
        {"prompt": [{"role": "user", "content": XSS_IMG}], "responses": ["<b>bold?</b>", "plain"]},
    ]
    running = serve(tmp_path, rows)  # the default annotator
    try:
        open_page(browser, running.url("annotator"))
        seen = set()
        for done in range(2):
            wait_progress(browser, done, 2)
            prompt, a, b = shown(browser)
            for name in ("response-a", "response-b"):
                assert by_testid(browser, name).find_elements(By.CSS_SELECTOR, "*") == []  # text only
            if prompt == XSS_SCRIPT:
                assert by_testid(browser, "prompt").find_elements(By.CSS_SELECTOR, "*") == []
                assert {a, b} == {XSS_IMG, f"{XSS_SCRIPT} and more"}
            else:  # a conversation: one turn, its role and its content as text
                turn = by_testid(browser, "prompt").find_element(By.CSS_SELECTOR, ".turn")
                assert turn.find_element(By.CSS_SELECTOR, ".role").text.lower() == "user"
                assert turn.find_element(By.CSS_SELECTOR, ".content").text == XSS_IMG
                assert by_testid(browser, "prompt").find_elements(By.TAG_NAME, "img") == []
                assert {a, b} == {"<b>bold?</b>", "plain"}
            seen.add(prompt == XSS_SCRIPT)
            press(browser, "1")
        wait_until(browser, lambda d: by_testid(d, "done").is_displayed())
        assert seen == {True, False}
        assert browser.execute_script("return window.__pwned === undefined")
        assert console_errors(browser) == []
    finally:
        running.stop()


def test_an_answer_sent_while_the_server_is_down_is_stored_once_when_it_is_back(browser, tmp_path):
    from rlhfkit.labelling.app import LabelApp
    from rlhfkit.web.server import Server

    running = serve(tmp_path, candidate_rows(3), "--annotators", "alice")
    port = running.server.port
    try:
        open_page(browser, running.url("alice"))
        wait_progress(browser, 0, 3)
        running.server.stop()  # the server goes away; the store (the file) stays
        by_testid(browser, "choose-b").click()
        wait_until(browser, lambda d: "trying again" in d.find_element("id", "status").text)
        running.server = Server(LabelApp(running.store).app, "127.0.0.1", port).start()  # back on the same port
        wait_progress(browser, 1, 3)
        assert [j.choice for j in running.store.judgments(include_undone=True)] == ["b"]
        assert all("ERR_CONNECTION_REFUSED" in e for e in console_errors(browser))  # only the failed tries
    finally:
        running.stop()
