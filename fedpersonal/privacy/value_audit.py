"""Value-level privacy audit: do the values of clients' private variables reach anything the server holds?

`fedpersonal.privacy.audit` checks the *dataflow* of a TFF computation (no SERVER-placed value derived only
from private inputs). It is static, so an expression such as ``federated_sum(p + 0 * d)`` (labelled
private *and* data) passes it although the server then receives exactly the sum of the private values. This
module checks *values*, by running rounds:

* **Invariance** (`changed_outputs`): run one round twice with the same server state and data but perturbed
  private values, flatten each round's SERVER-placed outputs (`server_outputs`: a `ProcessOutput`'s ``state``
  and ``metrics``; its CLIENTS-placed ``private_states`` are left out) and list the outputs that are not
  bit-identical. Perturbing a private value that cannot influence the client's training (a *canary*: an
  embedding row no example indexes, a padded table row, a variable no loss reads) must change nothing; a private
  value the training does read legitimately changes the global update (FURL's user embedding, FedRecon's
  reconstructed locals, FedDVA's decoder), so there the audit is the canary search below.
* **Provenance** (`canary_sightings`, `file_sightings`): plant a distinctive pattern in the private canaries and
  search every SERVER-placed output, and every file a training loop wrote, for the canary values and the
  functions of them a leak would release (`canary_functions`: each value; each client's sum and mean; the
  element-wise sum and mean over clients; the total sum and mean), as numbers and as the float32/float64 bytes
  of binary files (checkpoints). A sighting is a leak: no legitimate computation reproduces 7919.125 + k / 8.

`audit_round_values` combines both for one round. The audit is as good as its canaries: it shows that *the
planted values* and their sums and means never reach the server, and that the server's outputs do not depend on
them; a private value the training reads reaches the server through the trained global update by design (only
differential privacy on the global update bounds that, `fedpersonal.privacy` does not).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

# Distinctive canary values: 7919 (a prime) plus multiples of 1/8 are exact in float32 and unlikely elsewhere.
CANARY_BASE = 7919.125


def canary_pattern(shape: Sequence[int], *, client: int = 0, base: float = CANARY_BASE) -> np.ndarray:
    """A distinctive float32 pattern of `shape` for client number `client`: ``base + 97 * client + k / 8``.

    Every element differs from every other client's, and all are exact in float32 (so sums of a few are too).
    """
    size = int(np.prod(shape, dtype=np.int64))
    values = base + 97.0 * client + np.arange(size, dtype=np.float64) / 8.0
    return values.reshape(tuple(shape)).astype(np.float32)


def _leaves(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a nested structure: mappings, named tuples, attrs classes, sequences, tensors."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield from _leaves(child, f'{prefix}/{key}')
    elif hasattr(value, '_fields'):  # NamedTuple (ProcessOutput, ModelWeights, ...).
        for key in value._fields:
            yield from _leaves(getattr(value, key), f'{prefix}/{key}')
    elif hasattr(value, '__attrs_attrs__'):  # TFF's attrs-based states (e.g. LearningAlgorithmState).
        for attribute in value.__attrs_attrs__:
            yield from _leaves(getattr(value, attribute.name), f'{prefix}/{attribute.name}')
    elif isinstance(value, (list, tuple)):
        for index, child in enumerate(value):
            yield from _leaves(child, f'{prefix}/{index}')
    elif value is None:
        return
    else:
        yield prefix or '/', value


def flatten(value: Any, prefix: str = '') -> dict[str, np.ndarray]:
    """Every leaf of a nested value as a numpy array, keyed by its path (``'state/global_model_weights/0'``)."""
    flat = {}
    for path, leaf in _leaves(value, prefix):
        if hasattr(leaf, 'numpy'):
            leaf = leaf.numpy()
        flat[path.lstrip('/')] = np.asarray(leaf)
    return flat


def server_outputs(round_output: Any) -> dict[str, np.ndarray]:
    """The SERVER-placed outputs of a round, flattened (`flatten`).

    Args:
      round_output: A `fedpersonal.core.ProcessOutput` (its ``state`` and ``metrics``; the CLIENTS-placed
        ``private_states`` stay on the clients and are left out), a TFF `LearningProcessOutput`, or any other
        value, all of which is taken as SERVER-placed (e.g. an evaluation's metrics).
    """
    if hasattr(round_output, 'state') and hasattr(round_output, 'metrics'):
        return {**flatten(round_output.state, 'state'), **flatten(round_output.metrics, 'metrics')}
    return flatten(round_output)


def changed_outputs(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> list[str]:
    """Paths whose values differ between two flattened outputs (not bit-identical: dtype, shape or any bit;
    NaN equals NaN), including paths present in only one of them."""
    changed = []
    for path in sorted(set(a) | set(b)):
        if path not in a or path not in b:
            changed.append(path)
            continue
        x, y = np.asarray(a[path]), np.asarray(b[path])
        if x.dtype != y.dtype or x.shape != y.shape:
            changed.append(path)
        elif x.dtype.kind in 'fc':
            if not np.array_equal(x, y, equal_nan=True) or x.tobytes() != y.tobytes():
                changed.append(path)
        elif not np.array_equal(x, y):
            changed.append(path)
    return changed


def canary_functions(canaries: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The canaries and the functions of them a leak would most likely release.

    Args:
      canaries: One array per client: the private values planted in that client's state (same shape for all).

    Returns:
      ``{description: values}``: each client's values, each client's sum and mean, the element-wise sum and mean
      over clients, and the sum and mean of everything.
    """
    arrays = [np.asarray(c, np.float64) for c in canaries]
    found: dict[str, np.ndarray] = {}
    for i, c in enumerate(arrays):
        found[f'client {i} canary values'] = c.ravel()
        found[f'client {i} canary sum'] = np.array([c.sum()])
        found[f'client {i} canary mean'] = np.array([c.mean()])
    if len(arrays) > 1 and len({c.shape for c in arrays}) == 1:
        stacked = np.stack(arrays)
        found['sum over clients'] = stacked.sum(0).ravel()
        found['mean over clients'] = stacked.mean(0).ravel()
        found['sum of all canaries'] = np.array([stacked.sum()])
        found['mean of all canaries'] = np.array([stacked.mean()])
    return found


@dataclasses.dataclass(frozen=True)
class Sighting:
    """A canary value (or function of canaries) found in a server output or a written file."""

    where: str  # Output path, or file path (with the byte offset or line number).
    what: str  # Which canary function (`canary_functions`).
    value: float


def _matches(values: np.ndarray, targets: np.ndarray, rtol: float) -> np.ndarray:
    """Mask of `values` within `rtol` (relative) of any target."""
    if values.size == 0 or targets.size == 0:
        return np.zeros(values.shape, bool)
    targets = np.unique(targets)
    index = np.clip(np.searchsorted(targets, values), 0, targets.size - 1)
    nearest = np.minimum(np.abs(values - targets[index]), np.abs(values - targets[np.maximum(index - 1, 0)]))
    return nearest <= rtol * np.maximum(np.abs(values), 1.0)


def canary_sightings(
    outputs: Mapping[str, np.ndarray], canaries: Sequence[np.ndarray], *, rtol: float = 1e-6
) -> list[Sighting]:
    """Canary values (and `canary_functions` of them) found among the numbers of flattened outputs.

    Args:
      outputs: Flattened outputs (`server_outputs`, `flatten`).
      canaries: One array per client of planted private values.
      rtol: Relative tolerance of a match (canaries are 1/8 apart, about 1.6e-5 relative; float32 sums of a
        few are exact to about 1e-7).
    """
    functions = canary_functions(canaries)
    sightings = []
    for path, value in outputs.items():
        array = np.asarray(value)
        if array.dtype.kind not in 'fiuc':
            continue
        numbers = np.abs(array.astype(np.complex128)).ravel() if array.dtype.kind == 'c' else array.ravel()
        numbers = numbers.astype(np.float64)
        for what, targets in functions.items():
            hit = _matches(numbers, targets, rtol) | _matches(-numbers, targets, rtol)
            for k in np.flatnonzero(hit)[:3]:
                sightings.append(Sighting(where=f'{path}[{k}]', what=what, value=float(numbers[k])))
    return sightings


_NUMBER = re.compile(rb'[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?')


def file_sightings(root: str, canaries: Sequence[np.ndarray], *, rtol: float = 1e-6) -> list[Sighting]:
    """Canary values (and `canary_functions` of them) found in any file under `root`.

    Each file is searched for the little-endian float32 and float64 encodings of every target value (binary
    checkpoints, TensorBoard events) and, as text, for every decimal number within `rtol` (CSV, JSON).
    """
    functions = canary_functions(canaries)
    sightings = []
    for directory, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(directory, name)
            with open(path, 'rb') as f:
                content = f.read()
            numbers = [(m.start(), float(m.group())) for m in _NUMBER.finditer(content)]
            numbers = [(start, value) for start, value in numbers if np.isfinite(value)]
            values = np.array([v for _, v in numbers], np.float64)
            for what, targets in functions.items():
                for target in np.unique(targets):
                    for dtype in ('<f4', '<f8'):
                        encoded = np.asarray(target, dtype).tobytes()
                        offset = content.find(encoded)
                        if offset >= 0 and np.asarray(target, dtype) == target:  # Exactly representable only.
                            sightings.append(Sighting(f'{path}@{offset} ({dtype})', what, float(target)))
                hit = _matches(np.abs(values), targets, rtol)
                for k in np.flatnonzero(hit)[:3]:
                    line = content.count(b'\n', 0, numbers[k][0]) + 1
                    sightings.append(Sighting(f'{path}:{line}', what, float(values[k])))
    return sightings


@dataclasses.dataclass(frozen=True)
class ValueAuditReport:
    """What `audit_round_values` found.

    Attributes:
      changed: SERVER-placed outputs (paths) that differ between the round on the original and on the perturbed
        private states.
      sightings: Canary values (or sums, means) found in the SERVER-placed outputs of either round.
      outputs: The flattened SERVER-placed outputs (`server_outputs`) of the round on the original private states
        (e.g. to compare with a run whose non-canary private values differ).
    """

    changed: list[str]
    sightings: list[Sighting]
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def clean(self) -> bool:
        """No server output changed and no canary was seen."""
        return not self.changed and not self.sightings


def audit_round_values(
    run_round: Callable[[Any], Any],
    private_states: Any,
    perturbed_private_states: Any,
    *,
    canaries: Callable[[Any], Sequence[np.ndarray]],
    rtol: float = 1e-6,
) -> ValueAuditReport:
    """Runs one round on two versions of the clients' private states and audits the server's outputs.

    Args:
      run_round: ``private_states -> round output`` (the same server state and data every call, e.g.
        ``lambda p: process.run_round(state, data, p)``). Its SERVER-placed outputs are `server_outputs`.
      private_states: The clients' private states (whatever `run_round` takes; for a stateless algorithm such as
        FedRecon, e.g. the model function whose local variables' initial values are audited).
      perturbed_private_states: The same with the canaries (and only them) set to other values.
      canaries: ``private_states -> [one array per client]``: the canary values planted in `private_states`.
      rtol: Relative tolerance of a canary match.

    Returns:
      A `ValueAuditReport`: outputs changed by the perturbation, and canaries seen in either round's outputs.
    """
    first = server_outputs(run_round(private_states))
    second = server_outputs(run_round(perturbed_private_states))
    sightings = canary_sightings(first, canaries(private_states), rtol=rtol)
    sightings += canary_sightings(second, canaries(perturbed_private_states), rtol=rtol)
    return ValueAuditReport(changed=changed_outputs(first, second), sightings=sightings, outputs=first)
