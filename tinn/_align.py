"""Padding arithmetic shared by the encodings' and networks' output widths."""


def next_multiple(value: int, multiple: int) -> int:
    """The least multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple
