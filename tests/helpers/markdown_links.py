"""The links and images of markdown text, HTML tags included: one parser for the Lab's link test
(tests/repository/test_lab.py) and the docs' (tests/repository/test_docs_links.py)."""
import re

from markdown_it import MarkdownIt

_HTML_TARGET = re.compile(r"""<(img|a)\b[^>]*?\b(src|href)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)


def markdown_targets(text, tables: bool = False):
    """(kind, target) of every link ("link") and image ("image") in markdown text, HTML tags included; ``tables``:
    links inside GitHub tables too (commonmark alone reads a table as text)."""
    found = []

    def walk(tokens):
        for token in tokens:
            if token.type == "link_open":
                found.append(("link", token.attrGet("href")))
            elif token.type == "image":
                found.append(("image", token.attrGet("src")))
            elif token.type in ("html_inline", "html_block"):
                found.extend(("image" if tag.lower() == "img" else "link", target)
                             for tag, _, target in _HTML_TARGET.findall(token.content))
            walk(token.children or ())

    parser = MarkdownIt("commonmark")
    walk((parser.enable("table") if tables else parser).parse(text))
    return found
