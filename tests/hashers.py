from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """The default algorithm with one iteration: hashes made in tests still verify in
    Crucible subprocesses (Daphne, workers), which read the count from the hash."""

    iterations = 1
