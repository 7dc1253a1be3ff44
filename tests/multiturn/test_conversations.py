"""Conversations played turn by turn with a scripted policy: the trained sequence is exactly the tokens the
policy produced with the template's rendering of the tool and environment messages spliced between them,
the action mask marks the policy's tokens only, and the limits end conversations as documented."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.config.online import MultiTurnArgs
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.encode import encode_sft
from rlhfkit.data.schema import SFTExample
from rlhfkit.errors import UserError
from rlhfkit.multiturn.rollout import MultiTurn, conversation_metrics
from rlhfkit.trainers.online.rollout import action_order, conversation_tensors
from tests.multiturn.scripted import CALL, ENVS, TOOLS, call_then_answer, install, reply_ids

CHATML = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "tools.py").write_text(TOOLS)
    (tmp_path / "envs.py").write_text(ENVS)
    return tmp_path


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def chatml_tokenizer(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    return tok


def play(model, tokenizer, prompts, **options):
    args = MultiTurnArgs(**options)
    runner = MultiTurn(args, tokenizer)
    return runner, runner.rollout(
        model, prompts, list(range(len(prompts))), {}, GenerationArgs(max_new_tokens=100), "cpu"
    )


def test_the_sequence_is_the_sampled_tokens_with_the_templates_rendering_spliced_between(
    monkeypatch, model, tiny_model_dir, files
):
    tok = chatml_tokenizer(tiny_model_dir)
    install(monkeypatch, call_then_answer, space=False)
    runner, [c] = play(model, tok, [[{"role": "user", "content": "what is 2 + 3?"}]], tool=[f"{files}/tools.py:add"])
    first, second = reply_ids(tok, CALL, space=False), c.reply_ids
    assert c.turns == 2 and c.tool_calls == 1 and c.tool_errors == 0 and c.finished and not c.truncated
    # the policy's tokens are exactly what it sampled, in order, and only they are actions
    actions = [t for t, a in zip(c.ids, c.actions) if a]
    assert actions == first + second
    assert c.ids[: len(first)] == first and c.ids[-len(second) :] == second
    # between them: the end of the reply's turn and the tool's message, as the template renders them
    splice = c.ids[len(first) : -len(second)]
    assert all(a == 0 for a in c.actions[len(first) : -len(second)])
    expected = "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(splice) == expected
    # the whole sequence reads as the template's rendering of the conversation (the tools in its system turn)
    assert [m["role"] for m in c.messages] == ["user", "assistant", "tool", "assistant"]
    rendered = tok.apply_chat_template(c.messages, tools=[t.schema for t in runner.tools.values()], tokenize=False)
    assert tok.decode(c.prompt_ids + c.ids) + "\n" == rendered
    assert '"name": "add"' in tok.decode(c.prompt_ids)  # the schema reached the model


def test_with_the_plain_template_the_ids_equal_sft_encoding_of_the_same_conversation(
    monkeypatch, model, tiny_model_dir, files
):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    install(monkeypatch, call_then_answer)
    _, [c] = play(model, tok, [[{"role": "user", "content": "what is 2 + 3?"}]], tool=[f"{files}/tools.py:add"])
    input_ids, labels = encode_sft(tok, SFTExample(messages=c.messages), 10_000, 10_000)
    # SFT puts a newline after each reply's EOS; a conversation ends at its last reply's EOS
    assert c.prompt_ids + c.ids == input_ids[: len(c.prompt_ids) + len(c.ids)]
    trained = [i for i, label in enumerate(labels) if label != -100]
    assert [i - len(c.prompt_ids) for i in trained] == [i for i, a in enumerate(c.actions) if a]


def test_tool_errors_are_told_to_the_model_and_counted(monkeypatch, model, tiny_model_dir, files):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    calls = iter(['<tool_call>{"name": "broken", "arguments": {"a": 1}}</tool_call>', "<tool_call>{bad", "5"])
    install(monkeypatch, lambda context, rng: next(calls))
    _, [c] = play(model, tok, ["2 + 3"], tool=[f"{files}/tools.py:add", f"{files}/tools.py:broken"])
    assert (c.turns, c.tool_calls, c.tool_errors) == (3, 2, 2)
    assert [m["content"].split(":")[0] for m in c.messages if m["role"] == "tool"] == ["error", "error"]
    assert "raised ValueError: no luck" in c.messages[2]["content"]
    assert c.finished and c.reply == "5"


def test_limits_end_conversations_as_truncated(monkeypatch, model, tiny_model_dir, files):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    install(monkeypatch, lambda context, rng: CALL)  # never stops calling
    tool = [f"{files}/tools.py:add"]
    _, [c] = play(model, tok, ["2 + 3"], tool=tool, max_turns=3)
    assert c.turns == 3 and c.truncated and not c.finished and c.tool_calls == 2  # the last call not run
    _, convs = play(model, tok, ["2 + 3", "4 + 4"], tool=tool, max_turns=10, max_total_tokens=200)
    for c in convs:
        assert c.truncated and len(c.prompt_ids) + len(c.ids) <= 200
    assert conversation_metrics(convs)["rollout/truncated"] == 1.0
    with pytest.raises(UserError, match="opens with .* tokens, no fewer than --max-total-tokens 3"):
        play(model, tok, ["2 + 3"], tool=tool, max_total_tokens=3)


def test_an_environment_plays_turns_and_its_rewards_sit_at_their_turns_last_tokens(
    monkeypatch, model, tiny_model_dir, files
):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    install(monkeypatch, lambda context, rng: "ok")
    _, convs = play(model, tok, ["start", "begin"], env=f"{files}/envs.py:Counter", max_turns=5)
    for c in convs:
        assert c.turns == 3 and c.finished and c.env_reward == 6.0
        assert [m["role"] for m in c.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert c.messages[2]["content"] == "turn 1 done"
        assert [p for p, _ in c.turn_rewards] == c.turn_ends
    t = conversation_tensors(convs, tok.pad_token_id or 0, 0.5, "cpu")
    for b, c in enumerate(convs):
        placed = t.turn_rewards[b]
        assert placed[c.turn_ends].tolist() == [0.5, 1.0, 1.5] and float(placed.sum()) == 3.0
        assert t.action_mask[b, : len(c.ids)].tolist() == c.actions


def test_an_environment_that_raises_names_itself_and_the_row(monkeypatch, model, tiny_model_dir, files):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    install(monkeypatch, lambda context, rng: "ok")
    with pytest.raises(UserError, match=r"row 2: environment Exploding.step raised RuntimeError: the board is on fire"):
        MultiTurn(MultiTurnArgs(env=f"{files}/envs.py:Exploding"), tok).rollout(
            model, ["a", "b"], [1, 0], {}, GenerationArgs(max_new_tokens=8), "cpu"
        )


def test_the_estimators_see_the_policys_tokens_as_one_sequence():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    order = action_order(mask)
    assert order[0, :4].tolist() == [0, 1, 4, 5] and order[1, :3].tolist() == [0, 1, 2]
    assert action_order(torch.tensor([[1, 1, 0], [1, 0, 0]])) is None  # no gaps: nothing to reorder
    x = torch.arange(14.0).view(2, 7)
    back = torch.zeros_like(x).scatter(1, order, x.gather(1, order))
    assert torch.equal(back, x)
    assert math.isclose(float(mask.gather(1, order)[0, :4].sum()), 4.0)


def test_an_engines_log_probs_follow_the_policys_tokens_with_zeros_on_the_spliced_ones(model, tiny_model_dir, files):
    """A sampling engine (``--use-vllm``) plays every turn; its log-prob of each sampled token lands on that token
    in the rollout's ``engine_logprobs``, and the tool's spliced message gets 0 (no one sampled it)."""
    tok = chatml_tokenizer(tiny_model_dir)

    class ScriptedEngine:
        """The engine's contract: ``sample`` returns token ids and leaves their log-probs in ``last_logprobs``."""

        def __init__(self):
            self.turn, self.last_logprobs = 0, []

        def sample(self, model, contexts, generation):
            self.turn += 1
            text = CALL if self.turn == 1 else "it is 5"
            replies = [reply_ids(tok, text, space=False) for _ in contexts]
            # a distinct, recognisable log-prob for every token: -(turn + position / 1000)
            self.last_logprobs = [[-(self.turn + i / 1000) for i in range(len(r))] for r in replies]
            return replies

    runner = MultiTurn(MultiTurnArgs(tool=[f"{files}/tools.py:add"]), tok)
    prompt = [{"role": "user", "content": "what is 2 + 3?"}]
    [c] = runner.rollout(model, [prompt], [0], {}, GenerationArgs(max_new_tokens=100), "cpu", ScriptedEngine())
    assert c.turns == 2 and c.tool_calls == 1
    t = conversation_tensors([c], tok.pad_token_id, 1.0, "cpu")
    first, second = len(reply_ids(tok, CALL, space=False)), len(c.reply_ids)
    logprobs, actions = t.engine_logprobs[0].tolist(), t.action_mask[0].tolist()
    assert len(logprobs) == len(c.ids)
    expected = [-(1 + i / 1000) for i in range(first)] + [0.0] * (len(c.ids) - first - second)
    expected += [-(2 + i / 1000) for i in range(second)]
    assert logprobs == pytest.approx(expected)
    assert all(lp == 0.0 for lp, a in zip(logprobs, actions) if not a)
    # the own sampler leaves the field empty
    assert conversation_tensors([replace(c, logprobs=None)], tok.pad_token_id, 1.0, "cpu").engine_logprobs is None
