"""``dressage-worker view``: the read-only web viewer over the event log (see docs/view.md)."""
