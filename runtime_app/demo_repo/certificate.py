"""Count the primes below a bound and check the result against expected_result.json."""

import json
import sys

sys.path.insert(0, "code")

from primes import primes_below


def certificate(bound: int = 20000) -> dict:
    primes = primes_below(bound)
    return {"bound": bound, "count": len(primes), "last": primes[-1]}


if __name__ == "__main__":
    result = certificate()
    with open("expected_result.json") as handle:
        expected = json.load(handle)
    if result != expected:
        sys.exit(f"result changed: {result} != {expected}")
    print(json.dumps(result))
