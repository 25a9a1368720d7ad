"""Wording of user-facing messages: a count with its noun in the right number (TensorFlow-free).

>>> count(1, 'students'), count(0, 'students'), count(2, 'entries', 'entry'), count(1, 'entries', 'entry')
('1 student', '0 students', '2 entries', '1 entry')
"""

from __future__ import annotations


def count(n: int, plural: str, singular: str | None = None) -> str:
    """``'<n> <noun>'``: `singular` (default: `plural` without its final ``s``) when `n` is 1, else `plural`.

    Args:
      n: The count.
      plural: The noun's plural, e.g. ``'students'``.
      singular: Its singular when it is not `plural` without the ``s`` (e.g. ``'entry'`` for ``'entries'``).
    """
    if n != 1:
        return f'{n} {plural}'
    return f'{n} {singular if singular is not None else plural.removesuffix("s")}'
