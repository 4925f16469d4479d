"""The README states the two commands first and documents every setting Crucible reads."""

from crucible.config import VARIABLES
from tests.helpers import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_the_readme_starts_with_the_two_commands():
    head = "\n".join(README.splitlines()[:15])
    assert "make run" in head and "make test" in head


def test_the_readme_documents_every_environment_variable():
    missing = [v.name for v in VARIABLES if f"`{v.name}`" not in README]
    assert not missing, f"README.md does not document {missing}"
