from slugkit import slugify, unique_slug


def test_simple_title():
    assert slugify("Hello World") == "hello-world"


def test_digits_kept():
    assert slugify("Top 10") == "top-10"


def test_unique_slug():
    assert unique_slug("Hello World", {"hello-world", "hello-world-2"}) == "hello-world-3"
