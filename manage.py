#!/usr/bin/env python
"""Django's command-line utility for Crucible."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    # Importing crucible checks the environment first (crucible/celery.py): a bad
    # variable ends here with one line naming it.
    from django.core.management import execute_from_command_line  # noqa: PLC0415 - after the settings module is set

    import crucible  # noqa: F401, PLC0415 - checks the environment first

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
