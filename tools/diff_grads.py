"""Thin wrapper: `mok diff-grads` (mok/cli/main.py; exit status and --json in docs/reliability.md). Run: python tools/diff_grads.py --help"""

import sys

from mok.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["diff-grads"] + sys.argv[1:]))
