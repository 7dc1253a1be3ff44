"""The Markdown renderer of the pages' documents: what it keeps, and that no source text becomes markup."""

from __future__ import annotations

import re

import pytest

from rlhfkit.web.markdown import render


def flat(html: str) -> str:
    return html.replace("\n", "")


def test_headings_lists_tables_code_and_inline_markup():
    html = flat(
        render(
            "# Title\n\nSome **bold** and *em* and `code`.\n\n- one\n- two\n\n1. first\n\n"
            "| model | gold |\n|---|---|\n| PPO | 1.9 |\n\n```\nx < y\n```\n\n> quoted\n\n---\n"
        )
    )
    assert "<h1>Title</h1>" in html
    assert "<p>Some <strong>bold</strong> and <em>em</em> and <code>code</code>.</p>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html and "<ol><li>first</li></ol>" in html
    assert "<table><thead><tr><th>model</th><th>gold</th></tr></thead>" in html
    assert "<tbody><tr><td>PPO</td><td>1.9</td></tr></tbody></table>" in html
    assert "<pre><code>x &lt; y</code></pre>" in html
    assert "<blockquote><p>quoted</p></blockquote>" in html and "<hr />" in html


@pytest.mark.parametrize(
    "evil",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        "<svg onload=alert(1)>",
        '<a href="javascript:alert(1)">x</a>',
        "<iframe src=//evil.example></iframe>",
    ],
)
def test_source_html_is_escaped_everywhere(evil):
    for source in (
        evil,
        f"# {evil}",
        f"- {evil}",
        f"| {evil} |\n|---|\n| x |",
        f"**{evil}**",
        f"> {evil}",
        f"\n\n{evil}\n",
    ):
        html = render(source)
        assert not re.search(r"<(script|img|svg|a|iframe)\b", html), (source, html)
        assert "&lt;" in html


@pytest.mark.parametrize(
    "target",
    [
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "vbscript:msgbox(1)",
        "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
        "file:///etc/passwd",
        "&#106;avascript:alert(1)",  # an entity-encoded 'j'
    ],
)
def test_links_to_script_urls_are_not_links(target):
    for source in (f"[bad]({target})", f"<{target}>", f"[bad][ref]\n\n[ref]: {target}"):
        html = render(source)
        assert "<a " not in html and "href" not in html, (source, html)


def test_safe_links_open_without_referrer_and_images_only_where_mapped():
    html = render("[ok](https://example.org) [rel](docs/page.md) [here](#section)")
    assert '<a href="https://example.org" rel="noopener noreferrer">ok</a>' in html
    assert '<a href="docs/page.md" rel="noopener noreferrer">rel</a>' in html
    assert '<a href="#section" rel="noopener noreferrer">here</a>' in html
    assert render("![plot](plots/a.png)") == "<p>plot</p>\n"  # no image URL mapping: the alt text only
    mapped = render('![a "plot"](plots/a.png)', lambda src: f"/file/0/{src}")
    assert mapped == '<p><img src="/file/0/plots/a.png" alt="a &quot;plot&quot;"></p>\n'
    assert render("![plot](https://evil.example/x.png)", lambda src: None) == "<p>plot</p>\n"
    # the mapping sees the path as written, not markdown-it's percent-encoded form
    seen = []
    render("![p](plots/ä%20b.png)", lambda src: seen.append(src))
    assert seen == ["plots/ä b.png"]
