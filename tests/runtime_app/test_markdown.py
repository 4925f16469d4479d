"""Markdown that people write renders as HTML with nothing in it that could run or restyle a page."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.template import Context, Template

from runtime_app.markdown import ALLOWED_TAGS, markdown_html


class Elements(HTMLParser):
    """Every element and attribute a browser would build from the HTML, as (tag, name, value)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, "", ""))
        self.found.extend((tag, name, value or "") for name, value in attrs)

ATTACKS = [
    "<img src=x onerror=alert(1)>",
    "<script>window.pwned = 1</script>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](  javascript:alert(1))",
    "[data](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[vb](vbscript:msgbox(1))",
    "<iframe src=https://example.com></iframe>",
    '<p style="position:fixed;top:0">cover</p>',
    "<a href='javascript:alert(1)' onclick='alert(1)'>a</a>",
    "<svg onload=alert(1)>",
    '![x](https://example.com/x.png" onerror="alert(1))',
    "<<script>script>alert(1)<</script>/script>",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_attack_strings_render_without_scripts_handlers_styles_frames_or_script_links(attack):
    html = markdown_html(attack)
    for tag, name, value in Elements(html).found:
        assert tag in ALLOWED_TAGS, html
        assert name in ("", "href", "rel", "title", "start"), html
        if name == "href":
            assert value.split(":")[0] in ("http", "https", "mailto"), html


def test_raw_html_is_shown_as_text_not_dropped():
    assert markdown_html("<b>bold?</b>") == "<p>&lt;b&gt;bold?&lt;/b&gt;</p>\n"


def test_plain_markdown_keeps_its_emphasis_code_lists_quotes_and_line_breaks():
    html = markdown_html("**why** `x = 9`\nnext line\n\n- a\n- b\n\n> quoted\n\n```\nif a < b:\n```")
    assert "<strong>why</strong> <code>x = 9</code><br>" in html
    assert "<ul>\n<li>a</li>\n<li>b</li>\n</ul>" in html
    assert "<blockquote>\n<p>quoted</p>\n</blockquote>" in html
    assert "<pre><code>if a &lt; b:\n</code></pre>" in html


def test_links_keep_only_http_https_and_mailto_and_never_pass_the_referrer_or_rank():
    html = markdown_html("[a](https://example.com/x?y=1) [b](mailto:me@example.com) [c](/admin/) [d](ftp://x)")
    assert '<a href="https://example.com/x?y=1" rel="nofollow noopener noreferrer">a</a>' in html
    assert '<a href="mailto:me@example.com" rel="nofollow noopener noreferrer">b</a>' in html
    assert '<a rel="nofollow noopener noreferrer">c</a>' in html  # a relative link loses its target
    assert "ftp:" not in html.split("[d]")[0] and 'href="ftp' not in html


def test_the_template_filter_is_the_same_rendering_and_marks_it_safe_once():
    rendered = Template("{% load crucible_markdown %}{{ body|markdown }}").render(
        Context({"body": "*hi* <script>x()</script>"}))
    assert rendered == markdown_html("*hi* <script>x()</script>")
    assert "&lt;script&gt;" in rendered and "&amp;lt;" not in rendered


def test_an_empty_or_missing_body_renders_nothing():
    assert markdown_html("") == "" and Template("{% load crucible_markdown %}{{ x|markdown }}").render(
        Context({"x": None})) == ""
