"""What the benchmark report tests check of every Markdown table a benchmark renders, and the results they render."""


def assert_table(lines: list[str], header: int, rows: int) -> None:
    """lines[header] is a table's header: a separator of as many columns follows, then `rows` rows of as many."""
    columns = lines[header].count("|")
    assert lines[header + 1] == "|" + "---|" * (columns - 1)
    assert all(line.count("|") == columns for line in lines[header + 2 : header + 2 + rows])


def table_at(lines: list[str], header_start: str, rows: int) -> int:
    """The index of the first line starting with `header_start`, checked as a table header with `rows` rows
    (assert_table)."""
    header = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    assert_table(lines, header, rows)
    return header


def result(**fields) -> dict:
    """A benchmark result as the report functions read it: a stand-in of device_header's fields and the versions
    (what versions_line prints), then `fields`."""
    return {"device": "GPU", "date": "today", "torch": "t", "triton": "tr", "python": "p", **fields}
