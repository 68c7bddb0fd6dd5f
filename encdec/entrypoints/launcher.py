"""The `encdec` command's entry point. The command line's modules load inside `run`, so that
Ctrl-C during their import (torch's above all, about two seconds) ends the command as it does
later, with "encdec: interrupted" and exit status 130, not a traceback."""
import sys


def run() -> int:
    try:
        from encdec.entrypoints.cli import main
    except KeyboardInterrupt:
        print("encdec: interrupted", file=sys.stderr)
        return 130
    return main()
