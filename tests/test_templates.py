"""Template source checks that hold for every page: Django's `{# … #}` comment ends on its own
line, so one spread over two lines is printed on the page (use {% comment %} for those)."""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def unclosed_comments(text: str) -> list[int]:
    """The line numbers where a `{#` opens and no `#}` closes it on the same line."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        rest = line
        while "{#" in rest:
            rest = rest[rest.index("{#") + 2:]
            if "#}" not in rest:
                found.append(number)
                break
            rest = rest[rest.index("#}") + 2:]
    return found


def test_no_template_comment_runs_over_two_lines():
    problems = [f"{path.relative_to(TEMPLATES)}:{number}" for path in sorted(TEMPLATES.rglob("*"))
                if path.is_file() for number in unclosed_comments(path.read_text(encoding="utf-8"))]
    assert problems == [], "use {% comment %} … {% endcomment %} for these: " + ", ".join(problems)


def test_the_check_finds_a_comment_over_two_lines_and_passes_closed_ones():
    assert unclosed_comments("{# one line #}\n<p>{# a #} and {# b #}</p>") == []
    assert unclosed_comments("<p>\n{# starts here\n   ends here #}\n") == [2]
    assert unclosed_comments("{# closed #} then {# open\n") == [1]
