"""Turn a title into a lowercase ASCII slug."""

import re


def slugify(title):
    """Lowercase ``title`` and replace every run of characters that are not letters or digits by one dash (none at the ends)."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def unique_slug(title, taken):
    """A slug of ``title`` not in ``taken``: ``-2``, ``-3``... appended until it is free."""
    base = slugify(title)
    slug, n = base, 1
    while slug in taken:
        n += 1
        slug = f"{base}-{n}"
    return slug
