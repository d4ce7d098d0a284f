"""Thin wrapper: `mok golden regen` (mok/harness/cli.py; exit status and --json in docs/reliability.md). Run: python tools/regen_golden.py --help"""

import sys

from mok.harness.cli import main

if __name__ == "__main__":
    sys.exit(main(["golden", "regen"] + sys.argv[1:]))
