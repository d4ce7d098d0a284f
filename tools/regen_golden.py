"""Thin wrapper: `mok golden regen` (mok/cli/main.py; exit status and --json in docs/reliability.md). Run: python tools/regen_golden.py --help"""

import sys

from mok.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["golden", "regen"] + sys.argv[1:]))
