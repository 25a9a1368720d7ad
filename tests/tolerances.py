"""Float32 tolerances derived from the computation a test compares, not tuned on one machine.

Two float32 evaluations of one mathematical value that differ only in the order of their additions (another
instruction set's kernels: oneDNN picks them by CPU, XLA vectorizes for the host; another grouping of clients;
another thread count) each carry a rounding error of at most ``gamma(n) * sum(|terms|)`` for a sum of n terms
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1: ``|fl(sum x_i) - sum x_i| <=
gamma_{n-1} sum |x_i|`` with ``gamma_n = n u / (1 - n u)`` and ``u = 2**-24`` for float32), so the two differ by at
most twice that. A value built by `steps` sequential updates, each adding such a sum, accumulates at most `steps`
such errors to first order. `depth` is the longest chain of additions that feeds one compared element: the sum of
the reductions' lengths along the computation (a dense layer's fan-in, a batch's gradient sum, a mean over
clients); `scale` bounds ``sum(|terms|)``.

The bounds are worst cases: measured gaps are orders of magnitude smaller (errors of opposite signs cancel), while a
wrong computation (a missed step, another learning rate, a client left out) moves values by a fraction of their
size, far above any bound here. Every test using them states its depth and scale where it calls them.

`ISA_SETTINGS` names the oneDNN settings under which ``scripts/test.sh`` runs the tests marked ``numeric``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

U32 = 2.0**-24  # float32's unit roundoff.


def gamma(n: int, unit_roundoff: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of n sequential float operations."""
    if n * unit_roundoff >= 1:
        raise ValueError(f'gamma({n}) is unbounded for unit roundoff {unit_roundoff}.')
    return n * unit_roundoff / (1 - n * unit_roundoff)


def reorder_bound(*, depth: int, scale: float, steps: int = 1) -> float:
    """The largest gap between two float32 evaluations of one value that differ in the order of their sums.

    Args:
      depth: The longest chain of float additions feeding the value in one step (see the module docstring).
      scale: A bound on the sum of the absolute values of the terms of those additions.
      steps: How many sequential updates (training steps, rounds) each add such a value.
    """
    return 2.0 * steps * gamma(depth) * scale


def magnitude(*arrays: Any, floor: float = 1.0) -> float:
    """The largest absolute value among `arrays` (at least `floor`): a scale for `reorder_bound` where the terms of
    the sums are no larger than the values themselves or than `floor`."""
    values = [float(np.max(np.abs(np.asarray(a, dtype=np.float64)), initial=0.0)) for a in arrays]
    return max([floor, *values])


def assert_reordered_close(
    actual: Any, desired: Any, *, depth: int, steps: int = 1, scale: float | None = None, err_msg: str = ''
) -> None:
    """Asserts `actual` equals `desired` up to `reorder_bound` (scale: `magnitude` of both unless given)."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    bound = reorder_bound(depth=depth, steps=steps, scale=magnitude(actual, desired) if scale is None else scale)
    np.testing.assert_allclose(actual, desired, rtol=0, atol=bound, err_msg=err_msg)


def assert_trees_reordered_close(actual: Any, desired: Any, **kwargs: Any) -> None:
    """`assert_reordered_close` on each pair of leaves of two equal-structured sequences (nested lists/tuples)."""
    if isinstance(desired, (list, tuple)):
        assert len(actual) == len(desired), (len(actual), len(desired))
        for a, d in zip(actual, desired):
            assert_trees_reordered_close(a, d, **kwargs)
        return
    assert_reordered_close(actual, desired, **kwargs)
