from intervalkit import covers, merge


def test_merge_overlapping():
    assert merge([(1, 4), (2, 6)]) == [(1, 6)]


def test_merge_disjoint():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_merge_empty():
    assert merge([]) == []


def test_covers_endpoint():
    assert covers([(1, 3)], 3)
    assert not covers([(1, 3)], 4)


def test_merge_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_merge_touching_unsorted():
    assert merge([(7, 9), (3, 5), (5, 7)]) == [(3, 9)]
