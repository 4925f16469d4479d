"""The slow part candidates may change (it lies under the spec's write_roots)."""


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % d for d in range(2, n))


def primes_below(bound: int) -> list[int]:
    return [n for n in range(bound) if is_prime(n)]
