"""User-facing errors: one line naming the field and the fix, exit code 2, no traceback."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Bad input. The message reads `<field>: <what is wrong>; <what to set instead>`."""


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn bad input raised inside an entry point into one stderr line and exit code 2.

    `ValueError` is mapped too because `megatron_adapters` (which may not import hybridflow) reports
    bad input that way.
    """
    try:
        yield
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
