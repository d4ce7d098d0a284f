"""Thin wrapper: `mok golden check` (mok/cli/main.py; exit status and --json in docs/reliability.md). Run: python tools/check_golden.py --help"""

import sys

from mok.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["golden", "check"] + sys.argv[1:]))
