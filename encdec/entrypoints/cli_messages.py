"""What the `encdec` commands print on stderr, and the usage errors `main` reports."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from tqdm import tqdm

PROG = "encdec"
INSTALL_RAY = "pip install 'ray[data,serve]' (or, in the encdec checkout: pip install -e '.[ray]')"


class UsageError(ValueError):
    """A bad command line found after parsing: `main` reports it with the command's usage
    (exit status 2)."""


def error(message: str) -> None:
    """One `encdec: error: ...` line on stderr (above the progress bar, if one is showing)."""
    tqdm.write(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def file_error(name: str, err: BaseException) -> None:
    """`encdec: error: FILE: reason`, without the file name repeated inside the reason (an OS
    error, also one behind a decoding error, as its bare description: "permission denied")."""
    cause = err if isinstance(err, OSError) else err.__cause__
    input_error(name, os_reason(cause) if isinstance(cause, OSError) and cause.strerror
                else str(err) or type(err).__name__)


def os_reason(err: OSError) -> str:
    """The OS's description of `err` alone, lower-cased ("permission denied"): no error
    number, no file name (the message names the file its own way)."""
    return err.strerror.lower() if err.strerror else str(err)


def input_error(name: str, reason: str) -> None:
    """`encdec: error: NAME: reason`, without the name repeated at the reason's start or end."""
    for spelling in dict.fromkeys((name, str(Path(name)))):
        reason = reason.removeprefix(f"{spelling}: ").removesuffix(f": {spelling}")
    error(f"{name}: {reason}")


def warn(message: str) -> None:
    """One `encdec: warning: ...` line on stderr."""
    tqdm.write(f"{PROG}: warning: {message}", file=sys.stderr)


def option_wording(err: BaseException, options: dict[str, str]) -> str:
    """A ValueError of the Python API, with its parameter names spelt as the command's `options`
    (`dtype='float16'` -> `--dtype=float16`)."""
    return re.sub(r"\b(" + "|".join(options) + r")\b(?:='([^']*)')?",
                  lambda m: options[m[1]] + ("" if m[2] is None else f"={m[2]}"), str(err))
