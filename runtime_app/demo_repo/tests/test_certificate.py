import json

from certificate import certificate


def test_the_result_matches_the_expected_file():
    with open("expected_result.json") as handle:
        assert certificate() == json.load(handle)
