"""The one-line message for a database that could not be opened, with the right advice.

"is it running?" helps only when the server did not answer; a server that answered "database ... does
not exist" or "role ... does not exist" is running, and the message names what to create instead.
"""

from __future__ import annotations

import re

_MISSING = re.compile(r'(database|role) "([^"]+)" does not exist')


def cannot_open(what: str, url: object, orig: BaseException | None) -> str:
    """``cannot reach WHAT URL: <driver's first line>; <advice>`` for a failed connection."""
    text = str(orig if orig is not None else "").strip()
    first = text.splitlines()[0] if text else type(orig).__name__
    missing = _MISSING.search(text)
    if missing:
        kind, name = missing.groups()
        advice = (
            f"the server answered, but has no {kind} {name!r}: create it (e.g. `createdb {name}`) "
            "or fix the URL"
            if kind == "database"
            else f"the server answered, but has no role {name!r}: create it or fix the user in the URL"
        )
        return f"cannot open {what} {url!r}: {kind} {name!r} does not exist; {advice}"
    if "password authentication failed" in text or "no password supplied" in text:
        return f"cannot open {what} {url!r}: {first}; check the user and password in the URL"
    if "unable to open database file" in text:
        return f"cannot open {what} {url!r}: {first}; check that the folder exists and is writable"
    return f"cannot reach {what} {url!r}: {first}; is it running?"
