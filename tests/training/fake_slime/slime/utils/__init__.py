"""``slime.utils`` stand-in."""
