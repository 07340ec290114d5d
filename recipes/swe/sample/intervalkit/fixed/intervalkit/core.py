"""Merging and querying closed intervals."""


def merge(intervals):
    """Join the intervals that overlap or touch; the result is sorted by start."""
    result = []
    for start, end in sorted(intervals):
        if result and start <= result[-1][1]:
            last_start, last_end = result[-1]
            result[-1] = (last_start, max(last_end, end))
        else:
            result.append((start, end))
    return result


def covers(intervals, point):
    """Whether some interval contains ``point`` (endpoints included)."""
    return any(start <= point <= end for start, end in intervals)
