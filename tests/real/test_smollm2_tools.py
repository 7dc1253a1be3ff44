"""Multi-turn rollouts on SmolLM2-135M-Instruct's own chat template (ChatML with a default system turn and no
tool support of its own): the tools reach the model in a system message, the policy's tokens stay as sampled,
and the splice reads back as the template's rendering of the conversation."""

from __future__ import annotations

from rlhfkit.config.online import MultiTurnArgs
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.multiturn.rollout import MultiTurn
from tests.multiturn.scripted import CALL, TOOLS, call_then_answer, install, reply_ids


def test_a_tool_conversation_on_the_real_template_is_the_sampled_tokens_and_the_rendered_splice(
    monkeypatch, smollm2, tmp_path
):
    tok, model = smollm2
    (tmp_path / "tools.py").write_text(TOOLS)
    install(monkeypatch, call_then_answer, space=False)
    runner = MultiTurn(MultiTurnArgs(tool=[f"{tmp_path}/tools.py:add"]), tok)
    assert not runner.splicer.native_tools  # SmolLM2's template ignores tools=: they go in a system message
    [c] = runner.rollout(
        model, [[{"role": "user", "content": "What is 2 + 3?"}]], [0], {}, GenerationArgs(max_new_tokens=64), "cpu"
    )
    assert (c.turns, c.tool_calls, c.tool_errors, c.finished) == (2, 1, 0, True)
    first = reply_ids(tok, CALL, space=False)
    assert first[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the end-of-turn token stops a reply
    assert [t for t, a in zip(c.ids, c.actions) if a] == first + c.reply_ids
    prompt = tok.decode(c.prompt_ids)
    assert prompt.startswith("<|im_start|>system\nYou can call these tools:") and '"name": "add"' in prompt
    splice = tok.decode(c.ids[len(first) : -len(c.reply_ids)])
    assert splice == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    rendered = tok.apply_chat_template(runner.splicer.with_tools(c.messages), tokenize=False)
    assert tok.decode(c.prompt_ids + c.ids) + "\n" == rendered
