from versioncmp import compare, newest


def test_equal():
    assert compare("1.2.3", "1.2.3") == 0


def test_older_and_newer():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("2.0.0", "1.9.9") == 1


def test_newest():
    assert newest(["0.1", "0.3", "0.2"]) == "0.3"
    assert newest([]) is None


def test_multi_digit_parts():
    assert compare("1.10.0", "1.9.0") == 1
    assert newest(["1.9.0", "1.10.0", "1.2.0"]) == "1.10.0"


def test_missing_parts_are_zero():
    assert compare("1.2", "1.2.0") == 0
    assert compare("1.2", "1.2.1") == -1
