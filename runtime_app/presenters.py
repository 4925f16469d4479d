"""How runtime values read on a page, in the API and in the CLI: one helper each, shared by every app."""

from __future__ import annotations

# Every name a person gives (project, repository, spec title, agent, search) fits this many characters.
NAME_MAX_LENGTH = 96
# Twelve hex digits name a commit or a digest unambiguously in any repository Crucible handles.
SHORT_SHA_LENGTH = 12


def short_sha(sha: str | None) -> str:
    """The first 12 characters of a commit id or a SHA-256 digest ("" for none)."""
    return (sha or "")[:SHORT_SHA_LENGTH]


def names_rule(what: str = "letters, digits, spaces, dots, dashes or underscores") -> str:
    """The one sentence that says how long a name may be, for error messages and help texts."""
    return f"1–{NAME_MAX_LENGTH} {what}"
