"""A tiny CSV reader."""

from csvlite.reader import read_rows, split_row

__all__ = ["read_rows", "split_row"]
