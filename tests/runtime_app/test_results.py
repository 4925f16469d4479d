"""A trial's results against the baseline's: the first differing lines, or nothing."""

from __future__ import annotations

import pytest

from runtime_app.results import (
    SHOWN_CHARS,
    SHOWN_LINES,
    Difference,
    results_compare,
    results_compare_all,
    results_digest,
    stdout_results,
)


def test_equal_results_have_no_difference():
    assert results_compare(b"count 2262\nok\n", b"count 2262\nok\n") is None
    assert results_compare("text", "text") is None
    assert results_compare(b"", b"") is None


def test_the_first_differing_line_is_named_with_both_sides():
    difference = results_compare(b"a\ncount 2262\nz\n", b"a\ncount 2261\nz\n")
    assert isinstance(difference, Difference)
    assert difference.line == 2
    assert difference.summary() == "stdout line 2: baseline `count 2262` · candidate `count 2261`"
    assert (2, "count 2262") in difference.baseline and (2, "count 2261") in difference.candidate


def test_a_difference_shows_a_few_numbered_lines_around_it():
    baseline = "".join(f"line {n}\n" for n in range(1, 101))
    candidate = baseline.replace("line 50\n", "line fifty\n")
    difference = results_compare(baseline, candidate)
    assert difference.line == 50
    assert [number for number, _ in difference.baseline] == [48, 49, 50, 51, 52]
    assert len(difference.candidate) == SHOWN_LINES
    assert "   50 | line fifty" in difference.excerpt()


def test_long_lines_are_cut_and_unprintable_characters_replaced_in_what_is_shown():
    difference = results_compare(b"x" * 1000, b"y" * 1000 + b"\x1b[2J")
    shown = dict(difference.candidate)[1]
    assert len(shown) == SHOWN_CHARS and shown.endswith("…")
    assert "\x1b" not in results_compare(b"a", b"\x1b[31mred").summary()


def test_a_missing_or_extra_line_is_a_difference():
    fewer, more = results_compare(b"a\nb\n", b"a\n"), results_compare(b"a\n", b"a\nb\n")
    assert fewer.summary() == "stdout line 2: baseline `b` · candidate (no such line)"
    assert more.summary() == "stdout line 2: baseline (no such line) · candidate `b`"
    assert results_compare(b"a\n", b"").line == 1


def test_one_final_newline_and_crlf_line_ends_are_not_differences():
    assert results_compare(b"a\nb\n", b"a\nb") is None
    assert results_compare(b"a\r\nb\r\n", b"a\nb\n") is None
    assert results_compare(b"a\n\n", b"a\n") is not None  # an empty last line is a line


def test_exact_results_compare_numbers_as_text():
    assert results_compare(b"0.001", b"1e-3") is not None
    assert results_compare(b"1.0", b"1.00") is not None


@pytest.mark.parametrize(("baseline", "candidate", "tolerance", "same"), [
    (b"took 0.001 s", b"took 1e-3 s", 1e-9, True),
    (b"x = 1.0000000001", b"x = 1.0", 1e-9, True),
    (b"x = 1.001", b"x = 1.0", 1e-9, False),
    (b"x = 1.001", b"x = 1.0", 1e-2, True),
    (b"0.0 1e-12", b"1e-12 0", 1e-9, True),  # abs_tol: tiny values near zero
    (b"count 2262", b"count 2261", 1e-9, False),
    (b"count 2262", b"total 2262", 0.5, False),  # the words around the numbers compare exactly
    (b"1 2 3", b"1 2", 0.5, False),  # as many numbers on each side
    (b"a -1.5 b", b"a -1.5000000001 b", 1e-6, True),
    (b"nan inf", b"nan inf", 1e-6, True),
    (b"nan", b"inf", 1e-6, False),
])
def test_a_tolerance_compares_the_numbers_on_a_line_and_the_rest_exactly(
        baseline, candidate, tolerance, same):
    assert (results_compare(baseline, candidate, tolerance) is None) == same


def test_a_results_file_written_on_one_side_only_differs_with_a_note():
    difference = results_compare(b"42\n", None, where="out/result.json")
    assert difference.summary() == "out/result.json: the candidate wrote nothing there"
    assert results_compare(None, b"42", where="out/result.json").note == "the baseline wrote nothing there"
    assert results_compare(None, None, where="out/result.json") is None


def test_every_result_is_compared_stdout_first_then_the_files():
    baseline = {"stdout": b"ok\n", "out/a.txt": b"1\n", "out/b.txt": b"2\n"}
    assert results_compare_all(baseline, dict(baseline)) is None
    found = results_compare_all(baseline, {**baseline, "out/b.txt": b"3\n", "out/a.txt": None})
    assert found.where == "out/a.txt"
    assert results_compare_all(baseline, {"stdout": b"ok\n"}).where == "out/a.txt"  # a file it never wrote


def test_metric_lines_are_left_out_of_stdout_results_and_other_json_kept():
    stdout = b'count 2262\n{"ms": 1.5}\n  {"ms": 2, "other": 1}  \n{"note": "kept"}\n{not json\n'
    assert stdout_results(stdout, "ms") == b'count 2262\n{"note": "kept"}\n{not json\n'
    assert stdout_results(b'["ms"]\n', "ms") == b'["ms"]\n'


def test_a_digest_names_every_result_and_tells_missing_from_empty():
    one = results_digest({"stdout": b"a", "out/x": None})
    assert len(one) == 64 and one == results_digest({"out/x": None, "stdout": b"a"})
    assert one != results_digest({"stdout": b"a", "out/x": b""})
    assert one != results_digest({"stdout": b"b", "out/x": None})


def test_a_difference_serialises_for_a_receipt():
    data = results_compare(b"a\nb", b"a\nc").as_dict()
    assert data["line"] == 2 and data["summary"] == "stdout line 2: baseline `b` · candidate `c`"
    assert data["baseline"] == [[1, "a"], [2, "b"]]
