"""`python -m encdec ...` runs the `encdec` command line (`encdec.entrypoints.launcher`)."""
import sys

from encdec.entrypoints.launcher import run

if __name__ == "__main__":
    sys.exit(run())
