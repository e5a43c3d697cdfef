"""Errors that the CLI turns into one line on stderr and an exit code.

Everything a user can get wrong (a config, a checkpoint, a request) raises one of these with a
message that names the file and field; anything else is a bug and shows a traceback with --verbose.
"""

from __future__ import annotations

MAX_ECHO = 200  # characters of a path or value an error message repeats


def shorten(value: object, limit: int = MAX_ECHO) -> str:
    """`value` as text, cut in the middle when longer than `limit` characters: a message stays one
    readable line even when the input it names is a 10 MB path or value."""
    text = str(value)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...{text[-half:]} ({len(text)} characters)"


class TrtspecError(Exception):
    """A failure the user can act on; `exit_code` follows the CLI contract (1 failed run, 2 bad input)."""

    exit_code = 1


class UsageError(TrtspecError):
    """Bad input: a malformed config, a missing checkpoint, a wrong argument."""

    exit_code = 2


class ConfigError(UsageError):
    """A deployment config that cannot be loaded; the message starts with the file name."""


def run_script(main) -> int:
    """A benchmark's or tool's entry point with the CLI's contract: one line and the exit code."""
    import sys

    try:
        return main()
    except TrtspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
