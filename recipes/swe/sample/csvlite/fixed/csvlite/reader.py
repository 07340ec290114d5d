"""Split CSV lines into fields."""


def split_row(line):
    """The fields of one CSV line; a field may be quoted (``"a, b"``), with ``""`` for a quote inside."""
    fields, field, quoted, i = [], [], False, 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"' and line[i + 1 : i + 2] == '"':
                field.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                field.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == ",":
            fields.append("".join(field))
            field = []
        else:
            field.append(ch)
        i += 1
    fields.append("".join(field))
    return fields


def read_rows(text):
    """The rows of a CSV text, one per non-empty line."""
    return [split_row(line) for line in text.splitlines() if line]
