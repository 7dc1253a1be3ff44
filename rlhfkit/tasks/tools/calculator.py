"""The tool of the built-in tools task, on its own so that it can be copied beside the task's data and named
on the command line (``--tool DATA/calculator.py:add``): it imports nothing."""


def add(numbers: list[int]) -> int:
    """Add whole numbers and return their sum.

    Args:
        numbers: the numbers to add
    """
    return sum(int(n) for n in numbers)
