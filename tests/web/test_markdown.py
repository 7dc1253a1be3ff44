"""The Markdown renderer of the pages' documents: what it keeps, and that no source text becomes markup."""

from __future__ import annotations

from rlhfkit.web.markdown import render


def test_headings_lists_tables_code_and_inline_markup():
    html = render(
        "# Title\n\nSome **bold** and *em* and `code`.\n\n- one\n- two\n\n1. first\n\n"
        "| model | gold |\n|---|---|\n| PPO | 1.9 |\n\n```\nx < y\n```\n\n> quoted\n\n---\n"
    )
    assert "<h1>Title</h1>" in html
    assert "<p>Some <strong>bold</strong> and <em>em</em> and <code>code</code>.</p>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html and "<ol><li>first</li></ol>" in html
    assert "<table><tr><th>model</th><th>gold</th></tr><tr><td>PPO</td><td>1.9</td></tr></table>" in html
    assert "<pre><code>x &lt; y</code></pre>" in html
    assert "<blockquote><p>quoted</p></blockquote>" in html and "<hr>" in html


def test_source_html_is_escaped_everywhere():
    evil = "<script>alert(1)</script> <img src=x onerror=alert(1)>"
    for source in (evil, f"# {evil}", f"- {evil}", f"| {evil} |\n|---|\n| x |", f"**{evil}**"):
        html = render(source)
        assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html


def test_links_and_images_only_where_safe():
    html = render("[ok](https://example.org) [bad](javascript:alert(1)) [rel](docs/page.md)")
    assert '<a href="https://example.org"' in html and '<a href="docs/page.md"' in html
    assert "javascript:" not in html and "bad" in html
    assert render("![plot](plots/a.png)") == "<p>plot</p>"  # no image URL mapping: the alt text only
    mapped = render('![a "plot"](plots/a.png)', lambda src: f"/file/0/{src}")
    assert mapped == '<p><img src="/file/0/plots/a.png" alt="a &quot;plot&quot;"></p>'
