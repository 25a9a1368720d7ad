"""The process protocol's checks, for a `next` given as a computation and for one built on first use."""

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


def process(next_fn, round_runner=lambda *args, **kwargs: None):
    return core.PersonalizedProcess(initialize, next_fn, get_model_weights=lambda s: s, round_runner=round_runner)


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
    assert lazy.next(np.float32(1.0), [np.float32(2.0), np.float32(4.0)]).metrics == pytest.approx(3.0)


def test_next_that_is_not_a_process_round_is_refused_given_or_built():
    with pytest.raises(TypeError, match='must return a ProcessOutput'):
        process(bare_next)
    lazy = process(lambda: bare_next)
    for _ in range(2):  # A refused `next` is not kept: every use raises.
        with pytest.raises(TypeError, match='must return a ProcessOutput'):
            _ = lazy.next


def test_next_built_on_first_use_needs_a_round_runner():
    with pytest.raises(TypeError, match='unless a round_runner'):
        process(lambda: good_next, round_runner=None)
