"""What the exercise tests share: `fails`, the assertion that a checker turned an answer down
at the expected case, with the expected words in its message."""

from __future__ import annotations


def fails(result, case: int, *parts: str) -> None:
    assert not result.passed and result.failed_case == case, result.message
    for part in parts:
        assert part in result.message, f"{part!r} not in:\n{result.message}"
