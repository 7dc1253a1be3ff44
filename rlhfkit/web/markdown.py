"""A small Markdown-to-HTML renderer for the pages' documents (labelling guidelines, a run's report.md).

Safety comes first: every piece of the source is HTML-escaped before any markup is added, and the only
tags produced are the fixed ones below, so whatever a file contains shows as text and never runs. Links
keep http(s), relative and in-page targets only; images only relative paths, which ``image_url`` maps to a
URL the server answers (or drops, when None).

Supported: ATX headings, paragraphs, ``-``/``*``/``1.`` lists, pipe tables, fenced code blocks, block
quotes, horizontal rules, and inline code, bold, italics, links and images.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

_INLINE = re.compile(
    r"(?P<code>`[^`]+`)"
    r"|!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)"
    r"|\[(?P<text>[^\]]+)\]\((?P<href>[^)\s]+)\)"
    r"|\*\*(?P<bold>.+?)\*\*"
    r"|(?<![\w*])\*(?P<em>[^*\s][^*]*?)\*(?![\w*])"
)
_SAFE_HREF = re.compile(r"(https?://|#|\.{0,2}/|[\w.-]+(/|\.md|\.html|$))", re.IGNORECASE)


def _inline(text: str, image_url: Callable[[str], str | None] | None) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos : m.start()]))
        pos = m.end()
        if m.group("code"):
            out.append(f"<code>{html.escape(m.group('code')[1:-1])}</code>")
        elif m.group("src") is not None:
            url = image_url(m.group("src")) if image_url else None
            if url is None:
                out.append(html.escape(m.group("alt")))
            else:
                out.append(f'<img src="{html.escape(url)}" alt="{html.escape(m.group("alt"))}">')
        elif m.group("href") is not None:
            href = m.group("href")
            label = _inline(m.group("text"), None)
            if _SAFE_HREF.match(href) and not href.lower().startswith(("javascript:", "data:")):
                out.append(f'<a href="{html.escape(href)}" rel="noopener noreferrer">{label}</a>')
            else:
                out.append(label)
        elif m.group("bold"):
            out.append(f"<strong>{_inline(m.group('bold'), image_url)}</strong>")
        else:
            out.append(f"<em>{_inline(m.group('em'), image_url)}</em>")
    out.append(html.escape(text[pos:]))
    return "".join(out)


def _table(lines: list[str], image_url) -> str:
    def cells(line: str) -> list[str]:
        line = line.strip().strip("|")
        return [c.strip() for c in re.split(r"(?<!\\)\|", line)]

    head, body = cells(lines[0]), [cells(line) for line in lines[2:]]
    rows = ["<tr>" + "".join(f"<th>{_inline(c, image_url)}</th>" for c in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{_inline(c, image_url)}</td>" for c in row) + "</tr>" for row in body]
    return "<table>" + "".join(rows) + "</table>"


def render(source: str, image_url: Callable[[str], str | None] | None = None) -> str:
    """HTML for the Markdown ``source`` (see the module docstring for what is kept)."""
    lines = source.replace("\r\n", "\n").split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
        elif stripped.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1 : j])) + "</code></pre>")
            i = j + 1
        elif m := re.match(r"(#{1,6})\s+(.*)", stripped):
            level = len(m.group(1))
            out.append(f"<h{level}>{_inline(m.group(2).rstrip('#').strip(), image_url)}</h{level}>")
            i += 1
        elif re.fullmatch(r"(-{3,}|\*{3,}|_{3,})", stripped):
            out.append("<hr>")
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|?[\s:|-]+\|?", lines[i + 1].strip()):
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j], image_url))
            i = j
        elif re.match(r"([-*+]|\d+[.)])\s+", stripped):
            ordered = bool(re.match(r"\d", stripped))
            items: list[str] = []
            while i < len(lines) and lines[i].strip():
                m = re.match(r"\s*([-*+]|\d+[.)])\s+(.*)", lines[i])
                if m:
                    items.append(m.group(2))
                elif items:
                    items[-1] += " " + lines[i].strip()
                i += 1
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{_inline(t, image_url)}</li>" for t in items) + f"</{tag}>")
        elif stripped.startswith(">"):
            quoted = []
            while i < len(lines) and lines[i].strip().startswith(">"):
                quoted.append(lines[i].strip()[1:].strip())
                i += 1
            out.append(f"<blockquote>{render(chr(10).join(quoted), image_url)}</blockquote>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not _starts_block(lines[i], lines[i + 1 : i + 2]):
                para.append(lines[i].strip())
                i += 1
            if not para:  # a line that only looks like a block start (a lone '|'): keep it as text
                para, i = [stripped], i + 1
            out.append(f"<p>{_inline(' '.join(para), image_url)}</p>")
    return "\n".join(out)


def _starts_block(line: str, following: list[str]) -> bool:
    s = line.strip()
    if s.startswith(("```", "#", ">")) or re.match(r"([-*+]|\d+[.)])\s+", s):
        return True
    return s.startswith("|") and bool(following) and bool(re.fullmatch(r"\|?[\s:|-]+\|?", following[0].strip()))
