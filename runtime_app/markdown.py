"""Markdown that people write (comments, decision notes) as safe HTML: markdown-it-py renders it
with raw HTML off, then nh3 keeps only a small set of tags, attributes and link schemes."""

from __future__ import annotations

import nh3
from markdown_it import MarkdownIt

ALLOWED_TAGS = frozenset({
    "p", "br", "hr", "em", "strong", "s", "del", "code", "pre", "a", "ul", "ol", "li", "blockquote",
    "h1", "h2", "h3", "h4", "h5", "h6",
})
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}}
LINK_SCHEMES = frozenset({"http", "https", "mailto"})
LINK_REL = "nofollow noopener noreferrer"
# Dropped with everything inside them, not just unwrapped: their text is never meant as prose.
DROPPED_WITH_CONTENT = frozenset({"script", "style", "iframe", "object", "embed", "template", "noscript"})

# "commonmark" with html off: raw HTML in a body is shown as text, never parsed as markup; a
# newline is a line break, as people typing a comment expect.
_renderer = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False,
                                      "typographer": False}).enable("strikethrough")


def markdown_html(text: str) -> str:
    """`text` as sanitised HTML: the only way a person's markdown reaches a page."""
    rendered = _renderer.render(text or "")
    return nh3.clean(rendered, tags=set(ALLOWED_TAGS), clean_content_tags=set(DROPPED_WITH_CONTENT),
                     attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
                     url_schemes=set(LINK_SCHEMES), url_relative="deny", link_rel=LINK_REL,
                     strip_comments=True)
