"""What the benchmark report tests check of every Markdown table a benchmark renders."""


def assert_table(lines: list[str], header: int, rows: int) -> None:
    """lines[header] is a table's header: a separator of as many columns follows, then `rows` rows of as many."""
    columns = lines[header].count("|")
    assert lines[header + 1] == "|" + "---|" * (columns - 1)
    assert all(line.count("|") == columns for line in lines[header + 2 : header + 2 + rows])
