from versioncmp import compare, newest


def test_equal():
    assert compare("1.2.3", "1.2.3") == 0


def test_older_and_newer():
    assert compare("1.2.3", "1.2.4") == -1
    assert compare("2.0.0", "1.9.9") == 1


def test_newest():
    assert newest(["0.1", "0.3", "0.2"]) == "0.3"
    assert newest([]) is None
