"""Markdown to HTML for the pages' documents (labelling guidelines, a run's report.md), by markdown-it-py.

The CommonMark rules plus pipe tables, with raw HTML off: whatever HTML a file contains is escaped and shows as
text, never runs. Links go through markdown-it's link check, which refuses ``javascript:``, ``vbscript:``,
``file:`` and ``data:`` targets (such a link stays plain text), and open with ``rel="noopener noreferrer"``.
An image is shown only where ``image_url`` maps its source to a URL the server answers; otherwise (no mapping,
or None) its alt text stands in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

ImageUrl = Callable[[str], "str | None"]


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")

    def link_open(renderer: object, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        tokens[idx].attrSet("rel", "noopener noreferrer")
        return md.renderer.renderToken(tokens, idx, options, env)

    def image(renderer: object, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        alt = md.renderer.renderInlineAsText(token.children or [], options, env)
        src = unquote(str(token.attrGet("src") or ""))  # the path as written (markdown-it percent-encodes it)
        mapped = env["image_url"](src) if env.get("image_url") else None
        if mapped is None:
            return escape(alt)
        title = token.attrGet("title")
        title_attr = f' title="{escape(str(title))}"' if title else ""
        return f'<img src="{escape(mapped)}" alt="{escape(alt)}"{title_attr}>'

    md.add_render_rule("link_open", link_open)
    md.add_render_rule("image", image)
    return md


_MD = _parser()


def render(source: str, image_url: ImageUrl | None = None) -> str:
    """HTML for the Markdown ``source`` (see the module docstring for what is kept)."""
    return _MD.render(source, {"image_url": image_url})
