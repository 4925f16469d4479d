"""A scripted stand-in for an LLM writer (demo only): it applies one of several real
strategies to code/primes.py, chosen by $CRUCIBLE_CANDIDATE_ID, so the demo search shows
how the runtime judges good, bad and dishonest candidates without any API key.

Strategies, by candidate number (1-based, cycling):
  1 sieve of Eratosthenes (correct and fastest)
  2 trial division up to the square root (correct, faster than the baseline)
  3 a sieve with an off-by-one bound (faster but wrong: the exact result changes)
  4 the sieve plus a weakened test (touches the tests: the change policy refuses it)
  5 checks every divisor three times (correct but slower than the baseline)
  6 a syntax error (breaks the build)
  7 trial division, then prints a fake score and claims victory (the print is never read)
  8 hard-codes a list shaped like the expected result (a hidden test catches it)
  9 trial division with a 6k±1 wheel (correct, faster than the baseline)
 10 gives up without changing anything
"""

import os
import pathlib
import sys

SIEVE = '''"""Primes below a bound (sieve of Eratosthenes)."""


def primes_below(bound: int) -> list[int]:
    if bound < 3:
        return []
    flags = bytearray([1]) * bound
    flags[0] = flags[1] = 0
    for n in range(2, int(bound ** 0.5) + 1):
        if flags[n]:
            flags[n * n :: n] = bytes(len(range(n * n, bound, n)))
    return [n for n in range(bound) if flags[n]]
'''

SQRT = '''"""Primes below a bound (trial division up to the square root)."""


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def primes_below(bound: int) -> list[int]:
    return [n for n in range(bound) if is_prime(n)]
'''

WHEEL = '''"""Primes below a bound (trial division with a 6k +/- 1 wheel)."""


def is_prime(n: int) -> bool:
    if n < 4:
        return n >= 2
    if n % 2 == 0 or n % 3 == 0:
        return False
    d = 5
    while d * d <= n:
        if n % d == 0 or n % (d + 2) == 0:
            return False
        d += 6
    return True


def primes_below(bound: int) -> list[int]:
    return [n for n in range(bound) if is_prime(n)]
'''

OFF_BY_ONE = SIEVE.replace("return [n for n in range(bound) if flags[n]]",
                           "return [n for n in range(bound - 4) if flags[n]]")

SLOWER = '''"""Primes below a bound, checked three times to be sure."""


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(all(n % d for d in range(2, n)) for _ in range(3))


def primes_below(bound: int) -> list[int]:
    return [n for n in range(bound) if is_prime(n)]
'''

BROKEN = '''"""Primes below a bound."""


def primes_below(bound: int) -> list[int]
    return list(range(bound))
'''

FAKE_SCORE = SQRT + '''

print('{"median_runtime_ms": 0}')
'''

HARD_CODED = '''"""Primes below a bound (fast path for the certificate)."""


def primes_below(bound: int) -> list[int]:
    if bound == 20000:
        return [2] * 2261 + [19997]
    return [n for n in range(bound) if n > 1 and all(n % d for d in range(2, n))]
'''

STRATEGIES = ["sieve", "sqrt", "off_by_one", "touch_tests", "slower", "broken", "fake_score",
              "hard_coded", "wheel", "give_up"]


def main() -> None:
    sys.stdin.read()  # the prompt: a real writer would read it
    candidate = os.environ.get("CRUCIBLE_CANDIDATE_ID", "cand_001")
    number = int(candidate.rsplit("_", 1)[-1])
    strategy = STRATEGIES[(number - 1) % len(STRATEGIES)]
    code = pathlib.Path("code/primes.py")
    source = {"sieve": SIEVE, "sqrt": SQRT, "wheel": WHEEL, "off_by_one": OFF_BY_ONE,
              "touch_tests": SIEVE, "slower": SLOWER, "broken": BROKEN, "fake_score": FAKE_SCORE,
              "hard_coded": HARD_CODED}.get(strategy)
    if source is not None:
        code.write_text(source)
    if strategy == "touch_tests":
        test = pathlib.Path("tests/test_certificate.py")
        weakened = test.read_text().replace("assert certificate() ==", "assert True or certificate() ==")
        test.write_text(weakened)
    print(f"{candidate}: scripted strategy {strategy!r}")
    if strategy == "fake_score":
        print("All tests passed. Runtime improved by 99.9%.")
        print('{"median_runtime_ms": 0}')


if __name__ == "__main__":
    main()
