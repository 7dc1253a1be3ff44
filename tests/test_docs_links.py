"""The docs hold together: every relative link of README.md, docs/*.md and bench/README.md names a file that
exists and, after `#`, a heading of that file (GitHub's anchors); and the pages stay readable in one sitting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)

# bytes: the README is a front door, a page of docs/ is a guide that answers its question in one sitting (16 kB);
# the concepts page is the one reference read end to end, the option reference is generated
LIMITS = {"README.md": 12_500, "docs/concepts.md": 35_000, "docs/cli.md": None}
PAGE_LIMIT = 16_384


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, the text of code spans and links, punctuation other than `-` and
    `_` dropped, each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def test_slug_is_githubs():
    assert slug("11. Critic-free RL: GRPO, Dr. GRPO, REINFORCE++") == "11-critic-free-rl-grpo-dr-grpo-reinforce"
    assert slug("On a model: `rlhfkit demo --model PATH`") == "on-a-model-rlhfkit-demo---model-path"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_and_anchors_exist(page):
    broken = []
    for line, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{line}: {target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES[:-1], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_size(page):
    name = page.relative_to(ROOT).as_posix()
    limit = LIMITS.get(name, PAGE_LIMIT)
    if limit is None:
        pytest.skip("generated from the config dataclasses")
    size = len(page.read_bytes())
    assert size <= limit, f"{name} is {size:,} bytes, over {limit:,}: say what a user needs, history stays in git"
