"""Reading a text file a user named (``--expectations FILE``, a results directory).

Whatever is wrong with the file (missing, a directory, unreadable, not UTF-8 text) is a
usage error: exit 2 and one line naming the file and what is wrong, never a traceback.
"""
from __future__ import annotations

from ddp_conformance.errors import UsageError


def read_user_text(path: str, what: str) -> str:
    """The UTF-8 text of ``path``, ``what`` it is (e.g. "expectations file") naming it in
    the :class:`UsageError` raised when it cannot be read as such."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise UsageError(f"cannot read {what} {path!r}: not UTF-8 text (byte "
                         f"0x{exc.object[exc.start]:02x} on line {line})") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
