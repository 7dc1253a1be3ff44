"""Turn prompts and responses (strings or conversations) into text.

Conversations use the tokenizer's chat template when it has one. Otherwise a documented plain template:

    System: {content}\n
    User: {content}\n
    Assistant: {content}<eos>\n

and the generation prompt is ``Assistant:``. String prompts and responses are used verbatim
(``prompt + response``), so a response usually starts with a space.
"""

from __future__ import annotations

from rlhfkit.data.schema import Message, Text

PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
GENERATION_PROMPT = "Assistant:"


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _plain(messages: list[Message], add_generation_prompt: bool) -> str:
    text = "".join(f"{PLAIN_ROLES[m['role']]}: {m['content']}\n" for m in messages)
    return text + (GENERATION_PROMPT if add_generation_prompt else "")


def render_conversation(tokenizer, messages: list[Message], add_generation_prompt: bool) -> str:
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return _plain(messages, add_generation_prompt)


def render_prompt(tokenizer, prompt: Text) -> str:
    """The text a model continues from: the prompt string, or the conversation plus the generation prompt."""
    if isinstance(prompt, str):
        return prompt
    return render_conversation(tokenizer, prompt, add_generation_prompt=True)


def render_response(tokenizer, prompt: Text, response: Text) -> str:
    """The response text that follows ``render_prompt(prompt)`` (without the EOS token).

    A conversational response is a list of assistant messages (usually one); with a chat template
    the response text is what the template adds after the generation prompt.
    """
    if isinstance(response, str):
        return response
    if not has_chat_template(tokenizer):
        return " " + "\n".join(m["content"] for m in response)
    prompt_msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    head = render_conversation(tokenizer, prompt_msgs, add_generation_prompt=True)
    full = render_conversation(tokenizer, prompt_msgs + response, add_generation_prompt=False)
    if not full.startswith(head):  # templates that rewrite earlier turns: fall back to the bare content
        return "\n".join(m["content"] for m in response)
    return full[len(head) :]


def conversation_segments(tokenizer, messages: list[Message]) -> list[tuple[str, bool]]:
    """Split a conversation into ``(text, is_assistant_response)`` pieces whose concatenation is the text.

    SFT trains on the pieces flagged True: every assistant turn's content (with the chat template's
    end-of-turn marker; with the plain template the encoder appends EOS to each of them).
    """
    chat = has_chat_template(tokenizer)
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = render_conversation(tokenizer, messages[:i], add_generation_prompt=True)
        full = (
            render_conversation(tokenizer, messages[: i + 1], add_generation_prompt=False)
            if chat
            else head + " " + msg["content"]
        )
        if not head.startswith(done) or not full.startswith(head):
            raise ValueError("the chat template does not render this conversation prefix-consistently")
        pieces += [(head[len(done) :], False), (full[len(head) :], True)]
        done = full
        if not chat:
            pieces.append(("\n", False))
            done += "\n"
    return pieces
