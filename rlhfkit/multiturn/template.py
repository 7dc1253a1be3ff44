"""Token ids of a conversation that grows turn by turn, without ever re-tokenising what the model sampled.

The opening (the prompt's messages, the tools' schemas, the generation prompt) is rendered and tokenised once.
After each model turn only the new text is tokenised: what the chat template writes after a reply (e.g. the
newline after ``<|im_end|>``), the tool or environment messages, and the next generation prompt, found as
the difference between the template's rendering of the conversation with and without them. The model's own
tokens stay exactly as sampled, so the trained sequence is the sampled one.

The pieces are tokenised the way SFT tokenises a conversation (the text after a reply's end-of-turn token
apart from the next messages), so a policy fine-tuned on conversations sees the same token boundaries here.

Tools reach the model through the template's tool support (``apply_chat_template(tools=...)``). A template
that ignores tools gets them in a system message that describes them and the ``<tool_call>`` format; a
model without a chat template (the plain ``User:`` / ``Assistant:`` one) is not shown them and learns them
from its SFT data.
"""

from __future__ import annotations

import json

from rlhfkit.data.templates import has_chat_template, render_conversation
from rlhfkit.errors import UserError

PROBE_USER, PROBE_REPLY = "rlhfkit-probe-question", "rlhfkit-probe-reply"


def tools_system_prompt(schemas: list[dict]) -> str:
    """The system text that shows a template without tool support the tools and how to call them."""
    listed = "\n".join(json.dumps(s) for s in schemas)
    return (
        "You can call these tools:\n<tools>\n"
        f"{listed}\n</tools>\n"
        'To call one, reply with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>; its result comes '
        "back in a tool message. Reply without a tool call to give your final answer."
    )


class Splicer:
    """Renders and tokenises one tokenizer's conversations; ``schemas``: the tools' JSON schemas (may be empty)."""

    def __init__(self, tokenizer, schemas: list[dict]):
        self.tokenizer, self.schemas = tokenizer, schemas
        self.chat = has_chat_template(tokenizer)
        self.native_tools = bool(schemas) and self.chat and self._template_shows_tools()
        probe = [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": PROBE_REPLY}]
        text = self.render(probe, add_generation_prompt=False)
        # what the template writes after a reply: "<|im_end|>\n" (ChatML), "\n" (the plain template)
        self.after_reply = text[text.rindex(PROBE_REPLY) + len(PROBE_REPLY) :] if PROBE_REPLY in text else "\n"

    def _template_shows_tools(self) -> bool:
        messages = [{"role": "user", "content": PROBE_USER}]
        try:
            with_tools = self.tokenizer.apply_chat_template(messages, tools=self.schemas, tokenize=False)
        except Exception:  # a template that rejects the argument: describe the tools in a system message
            return False
        return with_tools != self.tokenizer.apply_chat_template(messages, tokenize=False)

    def with_tools(self, messages: list[dict]) -> list[dict]:
        """``messages`` with the tools' system message first, for a chat template that does not show tools."""
        if not self.schemas or self.native_tools or not self.chat:
            return messages
        note = tools_system_prompt(self.schemas)
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
        return [{"role": "system", "content": note}, *messages]

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        messages = self.with_tools(messages)
        if self.native_tools:
            return self.tokenizer.apply_chat_template(
                messages, tools=self.schemas, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        return render_conversation(self.tokenizer, messages, add_generation_prompt)

    def ids(self, text: str, special: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=special)["input_ids"] if text else []

    def opening(self, messages: list[dict]) -> list[int]:
        """The first prompt's ids (the plain template gets the tokenizer's special tokens, as ``encode_prompt``)."""
        return self.ids(self.render(messages, add_generation_prompt=True), special=not self.chat)

    def continuation(self, history: list[dict], new: list[dict], stop_text: str | None) -> list[int]:
        """The ids after a model reply that ended with a stop token whose text is ``stop_text`` (None: a stop
        token that the rendered text does not show, as the plain template's EOS): the rest of the template's
        end of the reply, then the ``new`` messages and the next generation prompt. ``history`` ends with the
        reply as an assistant message."""
        base = self.render(history, add_generation_prompt=False)
        full = self.render(history + new, add_generation_prompt=True)
        if not full.startswith(base):
            raise UserError(
                "the chat template renders a conversation differently once messages are added (it rewrites "
                "earlier turns); multi-turn rollouts need a template that only appends"
            )
        tail = self.after_reply
        if stop_text and tail.startswith(stop_text):
            tail = tail[len(stop_text) :]
        return self.ids(tail) + self.ids(full[len(base) :])
