"""README.md is the front door and docs/ holds one page per concern (design.md, Layout): every relative link and
image of these pages resolves, and README stays short enough to read in five minutes.

A target resolves when the file or folder exists, relative to the page's own folder and inside the repository; a
`#anchor` on a markdown target (or on the page itself) must name one of that page's headings, slugged as GitHub
slugs them. Links in code blocks are not links, and web addresses are not checked (no network here).
"""
import re
import urllib.parse
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from helpers.markdown_links import markdown_targets

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150
# The front door, the docs pages, and the folders' own READMEs that the pages link into and that link back.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "conformance" / "README.md", ROOT / "benchmarks" / "README.md"]

def targets(text):
    """(kind, target) of every link and image of a page, tables included."""
    return markdown_targets(text, tables=True)


def slug(heading):
    """GitHub's anchor for a heading's text: lower case, punctuation dropped (hyphens and underscores kept), each
    space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """Every anchor a markdown page defines through its headings; a repeated heading gets -1, -2, ... as on
    GitHub."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    seen, found = {}, set()
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type != "heading_open":
            continue
        text = "".join(child.content for child in inline.children
                       if child.type in ("text", "code_inline", "html_inline"))
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken(page, target):
    """Why a relative target of page does not resolve, or None if it does (web addresses: None)."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme or target.startswith("//"):
        return None
    path = (page.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else page
    if not path.is_relative_to(ROOT):
        return "outside the repository"
    if not path.exists():
        return "no such file or folder"
    if parts.fragment and path.suffix == ".md" and parts.fragment not in anchors(path):
        return f"no heading with the anchor #{parts.fragment} in {path.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    found = targets(page.read_text())
    bad = [f"{kind} {target!r}: {why}" for kind, target in found if (why := broken(page, target))]
    assert not bad, f"{page.relative_to(ROOT)}: {len(bad)} of {len(found)} links and images do not resolve:\n" + \
        "\n".join(bad)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/ (design.md, Layout)"


def test_readme_links_every_docs_page():
    linked = {target for _, target in targets((ROOT / "README.md").read_text())}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not missing, f"docs pages README.md does not link: {missing}"


def test_the_check_finds_broken_links(tmp_path, monkeypatch):
    """The checks above can fail: a missing file, a path out of the repository, a missing anchor."""
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("# A page\n\n## Two words, `code`\n\n## Two words, `code`\n\n```\n[not](a_link.md)\n```\n")
    assert targets(page.read_text()) == []
    assert broken(page, "../README.md") == "no such file or folder"
    assert broken(page, "../../elsewhere.md") == "outside the repository"
    assert broken(page, "#two-words-code") is None
    assert broken(page, "#two-words-code-1") is None
    assert broken(page, "page.md#no-such-heading").startswith("no heading")
    assert broken(page, "https://example.org/x.md#y") is None
    assert targets("[a](../x.py) ![b](img/y.png) <img src='z.svg'>\n\n| a | b |\n|---|---|\n| [t](t.md) | |\n") == \
        [("link", "../x.py"), ("image", "img/y.png"), ("image", "z.svg"), ("link", "t.md")]
