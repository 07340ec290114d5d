"""Split CSV lines into fields."""


def split_row(line):
    """The fields of one CSV line."""
    return line.split(",")


def read_rows(text):
    """The rows of a CSV text, one per non-empty line."""
    return [split_row(line) for line in text.splitlines() if line]
