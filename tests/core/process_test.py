"""The process protocol's checks, for a `next` given as a computation and for one built on first use, and the
`RoundBackend` that runs its rounds."""

import numpy as np
import pytest
import tensorflow_federated as tff

from fedpersonal import core


@tff.federated_computation
def initialize():
    return tff.federated_value(np.float32(0.0), tff.SERVER)


DATA = tff.FederatedType(np.float32, tff.CLIENTS)


@tff.federated_computation(initialize.type_signature.result, DATA)
def good_next(state, data):
    return core.ProcessOutput(state=state, metrics=tff.federated_mean(data), private_states=())


@tff.federated_computation(initialize.type_signature.result, DATA)
def bare_next(state, data):
    return state, tff.federated_mean(data)


class RecordingBackend:
    """A backend that records its calls and answers with a fixed output."""

    name = 'recording'

    def __init__(self):
        self.calls = []

    def run_round(self, process, state, client_data, private_states, *, client_ids):
        self.calls.append((process, state, client_data, private_states, client_ids))
        return core.ProcessOutput(state=state, metrics='recorded', private_states=())


def process(next_fn, backend=None):
    return core.PersonalizedProcess(
        initialize, next_fn, get_model_weights=lambda s: s, backend=RecordingBackend() if backend is None else backend
    )


def test_next_built_on_first_use_is_built_once_and_checked_like_a_given_one():
    built = []

    def build():
        built.append(good_next)
        return good_next

    lazy = process(build)
    assert not built  # Building the process did not build `next`.
    assert lazy.state_type.is_equivalent_to(process(good_next).state_type)
    assert lazy.next is good_next and lazy.next is good_next
    assert len(built) == 1
    assert lazy.next(np.float32(1.0), [np.float32(2.0), np.float32(4.0)]).metrics == 3.0  # Exact in float32.


def test_next_that_is_not_a_process_round_is_refused_given_or_built():
    with pytest.raises(TypeError, match='must return a ProcessOutput'):
        process(bare_next)
    lazy = process(lambda: bare_next)
    for _ in range(2):  # A refused `next` is not kept: every use raises.
        with pytest.raises(TypeError, match='must return a ProcessOutput'):
            _ = lazy.next


def test_next_built_on_first_use_needs_a_backend_of_its_own():
    with pytest.raises(TypeError, match='unless a backend runs the rounds'):
        core.PersonalizedProcess(initialize, lambda: good_next, get_model_weights=lambda s: s)


def test_the_default_backend_runs_next_in_tff():
    default = core.PersonalizedProcess(initialize, good_next, get_model_weights=lambda s: s)
    assert isinstance(default.backend, core.PerClientBackend) and default.simulation == 'per_client'
    output = default.run_round(np.float32(1.0), (np.float32(2.0), np.float32(6.0)), client_ids=['a', 'b'])
    assert output.state == 1.0 and output.metrics == 4.0  # The mean of 2 and 6: exact in float32.


def test_run_round_is_the_backends_round():
    backend = RecordingBackend()
    recorded = process(good_next, backend)
    assert recorded.simulation == 'recording'
    data = [np.float32(2.0)]
    output = recorded.run_round(np.float32(1.0), data, client_ids=['a'])
    assert output.metrics == 'recorded'
    assert backend.calls == [(recorded, np.float32(1.0), data, None, ['a'])]
