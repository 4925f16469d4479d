#!/usr/bin/env python
"""Django's command-line utility for Crucible."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crucible.settings")
    from crucible.config import ConfigError

    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    except ConfigError as error:
        # One clear line naming the variable, not a traceback.
        print(f"crucible: configuration error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
