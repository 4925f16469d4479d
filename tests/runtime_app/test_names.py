"""A ref name a person types reads as what it is: printable ASCII, every other character named."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from runtime_app.names import name_refusal
from search_app.services import branch_name_check

HOSTILE = [
    ("fix\u200dbug", "U+200D ZERO WIDTH JOINER (character 4) is an invisible format character"),
    ("fix\u200bbug", "U+200B ZERO WIDTH SPACE (character 4) is an invisible format character"),
    ("main\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE (character 5) is a bidirectional control"),
    ("a\u2066b", "U+2066 LEFT-TO-RIGHT ISOLATE (character 2) is a bidirectional control"),
    ("a\u2069b", "U+2069 POP DIRECTIONAL ISOLATE (character 2) is a bidirectional control"),
    ("a\u200eb", "U+200E LEFT-TO-RIGHT MARK (character 2) is an invisible format character"),
    ("re\u00adlease", "U+00AD SOFT HYPHEN (character 3) is an invisible format character"),
    ("m\u0430in", "U+0430 CYRILLIC SMALL LETTER A (character 2) looks like the ASCII 'a'"),
    ("\u0420elease", "U+0420 CYRILLIC CAPITAL LETTER ER (character 1) looks like the ASCII 'p'"),
    ("ma\u03b9n", "U+03B9 GREEK SMALL LETTER IOTA (character 3) looks like the ASCII 'i'"),
    ("\uff4d\uff41\uff49\uff4e",
     "U+FF4D FULLWIDTH LATIN SMALL LETTER M (character 1) is a compatibility form of 'm'"),
    ("\ufb01x", "U+FB01 LATIN SMALL LIGATURE FI (character 1) is a compatibility form of 'fi'"),
    ("fix\u00a0bug", "U+00A0 NO-BREAK SPACE (character 4) is a space or line break that is not U+0020"),
    ("fix\u3000bug", "U+3000 IDEOGRAPHIC SPACE (character 4) is a space or line break that is not U+0020"),
    ("caf\u00e9", "U+00E9 LATIN SMALL LETTER E WITH ACUTE (character 4) looks like the ASCII 'e'"),
    ("cafe\u0301", "U+0301 COMBINING ACUTE ACCENT (character 5) is a combining mark"),
    ("a\ue000b", "U+E000 (character 2) is a private-use character"),
    ("a\U000e0001b", "U+E0001 LANGUAGE TAG (character 2) is an invisible format character"),
    ("a\U0010fffeb", "U+10FFFE (character 2) is not an assigned character"),
    ("a\x7fb", "U+007F (character 2) is a control character"),
    ("\u6a5f\u80fd/\u6539\u5584", "U+6A5F CJK UNIFIED IDEOGRAPH-6A5F (character 1) is not ASCII"),
]


@pytest.mark.parametrize(("name", "words"), HOSTILE, ids=[ascii(name) for name, _ in HOSTILE])
def test_a_branch_name_with_a_character_that_is_not_printable_ascii_is_refused_naming_it(name, words):
    with pytest.raises(ValidationError) as raised:
        branch_name_check(name)
    message = raised.value.message_dict["branch"][0]
    assert words in message and "Type the name again with ASCII letters, digits and . _ - / only" in message
    assert message.startswith(f"{name!r} cannot be a branch: ")


def test_a_no_break_space_around_a_name_is_refused_not_trimmed_away():
    with pytest.raises(ValidationError, match="U\\+00A0 NO-BREAK SPACE"):
        branch_name_check("\u00a0main")
    assert branch_name_check("  main\n") == "main"


@pytest.mark.parametrize("name", ["crucible/abc-123", "feature/x_y.z", "crucible/search-1a2b3c4d5e6f7a8b",
                                  "release/2026.12", "Fix_UPPER-case"])
def test_an_ordinary_ascii_branch_name_is_accepted(name):
    assert branch_name_check(name) == name and name_refusal(name) == ""


def test_only_the_first_three_distinct_characters_are_listed_and_the_rest_counted():
    words = name_refusal("\u0430\u0430\u0435\u043e\u0440\u0441")
    assert words.count("CYRILLIC") == 3 and "; and 2 more." in words
