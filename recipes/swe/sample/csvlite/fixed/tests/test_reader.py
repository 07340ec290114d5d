from csvlite import read_rows, split_row


def test_plain_fields():
    assert split_row("a,b,c") == ["a", "b", "c"]


def test_empty_fields():
    assert split_row("a,,c") == ["a", "", "c"]


def test_read_rows_skips_blank_lines():
    assert read_rows("a,b\n\nc,d\n") == [["a", "b"], ["c", "d"]]


def test_quoted_field_with_comma():
    assert split_row('1,"Smith, Jane",NY') == ["1", "Smith, Jane", "NY"]


def test_doubled_quote_is_literal():
    assert split_row('"say ""hi""",x') == ['say "hi"', "x"]
