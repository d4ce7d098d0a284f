"""Thin wrapper: `mok golden check` (see mok/cli.py). Run: python tools/check_golden.py --help"""

import sys

from mok.harness.cli import main

if __name__ == "__main__":
    sys.exit(main(["golden", "check"] + sys.argv[1:]))
