"""`python -m mok.cli ...` runs the `mok` command."""
import sys

from .main import main

sys.exit(main())
