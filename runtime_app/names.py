"""Names a person types for a new ref (a merge's branch): they must read as what they are.

The rule is one line: every character is printable ASCII other than the space (U+0021–U+007E).
A name is read by people (the approver, the search page, `git branch`, a remote's web page),
and Unicode can make it read as another: invisible format characters (zero-width joiners, the
soft hyphen), bidirectional controls that reorder what is shown (U+202E, U+2066–U+2069),
compatibility forms that normalise to other letters (`ﬁ`, fullwidth `ｍａｉｎ`), combining
marks, spaces that are not U+0020, and letters of other scripts drawn like Latin ones
(Cyrillic `а` in `mаin`). A list of confusable characters never ends (Unicode adds some every
year); ASCII needs none, and every git tool, shell and URL reads an ASCII name plainly. So a
name in another script, even a single one (`機能/改善`), is refused too: name branches in ASCII.

Each refused character is named (code point and Unicode name) with why it is refused, using
the change policy's look-alike folding (runtime_app.policy) to say which ASCII it imitates.
"""

from __future__ import annotations

import unicodedata

from runtime_app.policy import _lookalike

# Unicode's bidirectional classes of the explicit embedding, override and isolate controls.
_BIDI_CONTROL_CLASSES = frozenset({"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"})
NAME_RULE = "ASCII letters, digits and . _ - / only"


def character_shown(char: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`: a character as people can read it whatever it is (a
    control, private-use or unassigned one has no name: its code point alone)."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name}" if name else f"U+{ord(char):04X}"


def character_refusal(char: str) -> str:
    """Why `char` may not be in a ref name a person types ('' for printable ASCII but space)."""
    if "!" <= char <= "~":
        return ""
    category = unicodedata.category(char)
    if char == " ":
        return "is a space"
    if category == "Cc":
        return "is a control character"
    if unicodedata.bidirectional(char) in _BIDI_CONTROL_CLASSES:
        return "is a bidirectional control: it reorders how the text around it is shown"
    if category == "Cf":
        return "is an invisible format character"
    if category in ("Zs", "Zl", "Zp"):
        return "is a space or line break that is not U+0020"
    if category == "Co":
        return "is a private-use character: it has no agreed look"
    if category in ("Cn", "Cs"):
        return "is not an assigned character"
    if category in ("Mn", "Mc", "Me"):
        return "is a combining mark: it joins the character before it"
    normal = unicodedata.normalize("NFKC", char)
    if normal != char:
        return f"is a compatibility form of {normal!r} (NFKC normalises it)"
    folded = _lookalike(char)
    if folded and folded.isascii() and folded.isprintable():
        return f"looks like the ASCII {folded!r}"
    return "is not ASCII"


def name_refusal(name: str, *, shown: int = 3) -> str:
    """'' if every character of `name` is printable ASCII but the space; else which characters
    (the first `shown` distinct ones, with their positions from 1) and why, and what to do."""
    problems: list[str] = []
    seen: set[str] = set()
    for position, char in enumerate(name, start=1):
        why = character_refusal(char)
        if not why or char in seen:
            continue
        seen.add(char)
        problems.append(f"{character_shown(char)} (character {position}) {why}")
    if not problems:
        return ""
    more = len(seen) - shown
    listed = "; ".join(problems[:shown]) + (f"; and {more} more" if more > 0 else "")
    return f"{listed}. Type the name again with {NAME_RULE}"
