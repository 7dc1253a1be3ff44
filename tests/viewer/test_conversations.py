"""`rlhfkit view` on multi-turn runs: a sample's conversation after its prompt, turn by turn."""

from __future__ import annotations

import json
import urllib.request

from rlhfkit.viewer.app import ViewerApp
from rlhfkit.viewer.runs import conversation_turns, find_runs
from rlhfkit.web.server import Server
from tests.helpers import write_jsonl
from tests.viewer.test_viewer import write_run
from tests.web.browser import console_errors

CALL = '<tool_call>{"name": "add", "arguments": {"numbers": [12, 30]}}</tool_call>'
XSS = "<img src=x onerror=\"window.__pwned = 'turn'\">"


def test_turns_after_the_prompt_are_labelled_by_what_they_are():
    prompt = [{"role": "user", "content": "12 + 30"}]
    messages = [
        *prompt,
        {"role": "assistant", "content": f" {CALL}"},
        {"role": "tool", "content": "error: 'add' raised ValueError"},
        {"role": "assistant", "content": ' {"name": "add", "arguments": {"numbers": [12, 30]}}'},  # the json format
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": " 42"},
        {"role": "user", "content": "correct"},
        {"role": "critic", "content": {"note": 1}},
        "not a message",
        {"role": "assistant", "content": f"again {CALL}"},  # the turns ran out before the tool answered
    ]
    turns = conversation_turns(messages, prompt)
    assert [(t["role"], t["kind"]) for t in turns] == [
        ("assistant", "tool call"),
        ("tool", "tool error"),
        ("assistant", "tool call"),
        ("tool", "tool result"),
        ("assistant", "reply"),
        ("user", "environment"),
        ("critic", "other"),
        ("assistant", "tool call"),
    ]
    assert turns[1]["content"] == "error: 'add' raised ValueError" and turns[6]["content"] == '{"note": 1}'

    # a string prompt is one user message, after a system message the run added
    added = [{"role": "system", "content": "tools: add"}, {"role": "user", "content": "12 + 30"}]
    assert conversation_turns([*added, {"role": "assistant", "content": "42"}], "12 + 30") == [
        {"role": "assistant", "content": "42", "kind": "reply"}
    ]
    # an environment's own opening is not the prompt: the whole conversation is shown
    opening = [{"role": "system", "content": "a game"}, {"role": "user", "content": "guess a number"}]
    assert [t["kind"] for t in conversation_turns([*opening, {"role": "assistant", "content": "7"}], "play")] == [
        "system",
        "environment",
        "reply",
    ]
    assert conversation_turns("not a list", "12 + 30") == [] and conversation_turns([], None) == []


def test_the_api_sends_a_multi_turn_rows_turns_and_single_turn_rows_as_written(tmp_path):
    run = write_run(tmp_path / "grpo", kl_coef=0.1)
    prompt = [{"role": "user", "content": "12 + 30"}]
    messages = [*prompt, {"role": "assistant", "content": " 42"}]
    single = {"step": 40, "prompt": "Agent:", "response": " hi", "score": 0.5}
    multi = {"step": 40, "prompt": prompt, "response": " 42", "score": 1.0, "messages": messages}
    with (run / "samples.jsonl").open("a") as handle:
        handle.write(json.dumps(single) + "\n" + json.dumps(multi) + "\n")
    server = Server(ViewerApp(find_runs([str(run)])).app, "127.0.0.1", 0).start()
    try:
        rows = json.load(urllib.request.urlopen(server.url("/api/samples")))["runs"][0]["rows"]
    finally:
        server.stop()
    assert rows[-2] == single
    sent = {k: v for k, v in multi.items() if k != "messages"}
    assert rows[-1] == {**sent, "turns": [{"role": "assistant", "content": " 42", "kind": "reply"}]}


def test_the_samples_tab_shows_a_conversation_turn_by_turn(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    root = tmp_path / "runs"
    write_run(root / "ppo", kl_coef=0.1)
    run = write_run(root / "tools", kl_coef=0.1)
    prompt = [{"role": "user", "content": "12 + 30"}]
    messages = [
        *prompt,
        {"role": "assistant", "content": f" {CALL}"},
        {"role": "tool", "content": f"error: no tool {XSS}"},
        {"role": "assistant", "content": f" {CALL}"},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": " 42"},
        {"role": "user", "content": "correct, now 1 + 1"},
        {"role": "assistant", "content": f" 2 {XSS}"},
    ]
    write_jsonl(
        run / "samples.jsonl",
        [{"step": 7, "prompt": prompt, "response": "...", "score": 1.0, "messages": messages}],
    )
    server = Server(ViewerApp(find_runs([str(root)])).app, "127.0.0.1", 0).start()
    try:
        console_errors(browser)  # forget what earlier pages logged
        browser.get(server.url("/") + "#samples")
        wait = WebDriverWait(browser, 10, poll_frequency=0.05)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".sample")) == 3)
        # the single-turn run shows its response as before, with no conversation
        response = browser.find_elements(By.CSS_SELECTOR, ".sample-response")[0]
        assert response.text.strip() == "sorry, order 0 ships today"
        assert browser.find_elements(By.CSS_SELECTOR, ".conversation") == []

        select = browser.find_element(By.ID, "sample-run")
        select.find_element(By.CSS_SELECTOR, 'option[value="runs/tools"]').click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".turn")) == 7)
        assert browser.find_elements(By.CSS_SELECTOR, ".sample-response") == []
        assert "12 + 30" in browser.find_element(By.CSS_SELECTOR, ".sample-prompt").text

        def text(node, selector):
            found = node.find_elements(By.CSS_SELECTOR, selector)
            return found[0].get_attribute("textContent") if found else ""

        shown = [
            (turn.get_attribute("data-kind"), text(turn, ".turn-role"), text(turn, ".badge"), text(turn, ".turn-text"))
            for turn in browser.find_elements(By.CSS_SELECTOR, ".turn")
        ]
        assert shown == [
            ("tool call", "assistant", "tool call", f" {CALL}"),
            ("tool error", "tool result", "error", f"error: no tool {XSS}"),
            ("tool call", "assistant", "tool call", f" {CALL}"),
            ("tool result", "tool result", "", "42"),
            ("reply", "assistant", "", " 42"),
            ("environment", "environment", "", "correct, now 1 + 1"),
            ("reply", "assistant", "", f" 2 {XSS}"),
        ]
        error = browser.find_element(By.CSS_SELECTOR, '.turn[data-kind="tool error"] .badge.error')
        assert error.is_displayed() and error.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
        assert browser.find_elements(By.CSS_SELECTOR, ".conversation img") == []
        assert browser.execute_script("return window.__pwned === undefined")
        assert console_errors(browser) == []
    finally:
        server.stop()
