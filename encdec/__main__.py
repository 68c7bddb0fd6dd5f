"""`python -m encdec ...` runs the `encdec` command line."""
import sys

from encdec.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main())
