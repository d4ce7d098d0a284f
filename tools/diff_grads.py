"""Thin wrapper: `mok diff-grads` (see mok/cli.py). Run: python tools/diff_grads.py --help"""

import sys

from mok.harness.cli import main

if __name__ == "__main__":
    sys.exit(main(["diff-grads"] + sys.argv[1:]))
