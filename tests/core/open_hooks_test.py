"""An algorithm brings its own math and no backend changes: a step kind (`step_kinds.StepKind`), a personal model
(`client_plan.Personalization`), a client start (`client_start.ClientStart`), a penalty (`client_plan.Penalty`) and
shared values (`shared_values.SharedValues`) defined here, in the test, run on both backends, and each backend
equals a plain eager loop written here. (The library's own Per-FedAvg, pFedMe, APFL, FedALA and SCAFFOLD are such
objects, in their modules.)"""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import models
from fedpersonal.algorithms import moon
from fedpersonal.algorithms import scaffold
from fedpersonal.core import client_plan
from fedpersonal.core import client_start
from fedpersonal.core import step_kinds
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.apfl_test import _loss_and_grads
from tests.algorithms.apfl_test import model_fn as keras_model
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets

DIM, HIDDEN, NUM_CLASSES = 6, 8, 3
LR, BATCH = 0.1, 10
# The longest chain of additions feeding a weight in one gradient of the DIM-HIDDEN-NUM_CLASSES model on a batch of
# 10 (client_arrays: 4 clients of at most 40 examples): forward fan-ins (6 + 8), backward fan-outs (3 + 8), the
# batch's sum (10), the weighted mean over the 4 clients.
DEPTH = DIM + HIDDEN + NUM_CLASSES + HIDDEN + BATCH + 4
# The normalized step also sums the squares of all the model's parameters' gradients.
NORM_DEPTH = DEPTH + DIM * HIDDEN + HIDDEN + HIDDEN * NUM_CLASSES + NUM_CLASSES
# Sequential updates in the comparisons: 2 rounds of 4 batches (2 epochs in the personal test: 8 more).
STEPS = 2 * 4 * 2
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))


def loss_fn():
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def model_fn():
    model = keras_model()
    return models.from_keras_model(model, input_spec=SPEC, global_layers=model.layers, local_layers=[])


def sgd_reference(body, arrays, direction):
    """FedAvg's round written here: each client's SGD steps of LR along ``direction(gradient, body)`` from `body`,
    the examples-weighted mean of the trained weights."""
    trained, examples = [], []
    for x, y in arrays:
        w, seen = [np.array(b) for b in body], 0
        for s in range(0, len(x), BATCH):
            g = _loss_and_grads(w, x[s : s + BATCH], y[s : s + BATCH])
            w = [wi - LR * di for wi, di in zip(w, direction(g, body))]
            seen += len(x[s : s + BATCH])
        trained.append(w)
        examples.append(seen)
    total = float(sum(examples))
    return [sum(n * t[k] for n, t in zip(examples, trained)) / total for k in range(len(body))]


# ------------------------------------------------------------------ a step kind of the test's own
@dataclasses.dataclass(frozen=True)
class NormalizedStep:
    """Normalized gradient descent: the direction is the gradient over its global norm (plus `eps`)."""

    eps: float = 1e-3
    parts: int = 1
    output_part: int = 0
    carries_personal: bool = False
    carried_start: str = 'received'

    def check(self, trains):
        del trains

    def direction(self, weights, carried, parts, derivatives):
        loss, gradient, output = derivatives.gradient(weights, parts[0])
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in gradient])) + self.eps
        return step_kinds.Step(loss, output, list(carried), [g / norm for g in gradient])


def normalized_reference(body, arrays):
    def direction(g, body):
        norm = np.sqrt(sum(float(np.sum(np.square(gi, dtype=np.float64))) for gi in g)) + 1e-3
        return [gi / norm for gi in g]

    return sgd_reference(body, arrays, direction)


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_step_kind_written_here_runs_on_every_backend_as_a_plain_loop(backend):
    sgd = tff.learning.optimizers.build_sgdm(LR)
    plan = client_plan.ClientPlan((client_plan.Phase((client_plan.GLOBAL,), 1, sgd, step=NormalizedStep()),))
    with backends.use(backend):
        process = backends.build_process(
            plan, model_fn, loss_fn=loss_fn, server_optimizer=tff.learning.optimizers.build_sgdm(1.0)
        )
    assert process.simulation == backend
    arrays = client_arrays()
    state = process.initialize()
    body = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    start = [b.copy() for b in body]
    for _ in range(2):
        state = process.run_round(state, datasets(arrays), [process.initial_private_state()] * len(arrays)).state
        body = normalized_reference(body, arrays)
    got = process.get_model_weights(state).trainable
    # The normalized steps moved the weights far beyond the bound: the comparison cannot pass by standing still.
    assert max(float(np.max(np.abs(b - s))) for b, s in zip(body, start)) > 1e-2
    for g, w in zip(got, body):
        tolerances.assert_reordered_close(g, w, depth=NORM_DEPTH, steps=STEPS)


def test_a_step_kind_that_is_not_one_is_a_clear_error():
    sgd = tff.learning.optimizers.build_sgdm(LR)
    with pytest.raises(ValueError, match='StepKind'):
        client_plan.Phase((client_plan.GLOBAL,), 1, sgd, step=object())


# ------------------------------------------------------------------ a personal model of the test's own
# The client keeps an offset v (a copy of the model) and a gain s; it trains and predicts with w + s * (v - w)
# (w: the received global weights), and its gain stays at most 1.6 after each phase (two of the four clients
# reach it).
def offset_personalization():
    return client_plan.Personalization(
        extras=lambda weights: [tf.constant(1.5)],
        predicts_with=lambda kept, received: [w + kept[-1] * (v - w) for v, w in zip(kept[:-1], received)],
        finish=lambda kept, model: list(kept[:-1]) + [tf.minimum(kept[-1], 1.6)],
    )


def offset_reference(body, privates, arrays):
    new_privates = []
    for (x, y), private in zip(arrays, privates):
        v, s = [np.array(p) for p in private[:-1]], float(private[-1])
        for start in range(0, len(x), BATCH):
            g = _loss_and_grads(
                [wi + s * (vi - wi) for vi, wi in zip(v, body)], x[start : start + BATCH], y[start : start + BATCH]
            )
            d_s = sum(float(np.sum((vi - wi) * gi)) for vi, wi, gi in zip(v, body, g))
            v = [vi - LR * s * gi for vi, gi in zip(v, g)]
            s -= LR * d_s
        new_privates.append(v + [np.float32(min(s, 1.6))])
    return new_privates


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_personal_model_written_here_runs_on_every_backend_as_a_plain_loop(backend):
    sgd = tff.learning.optimizers.build_sgdm(LR)
    personal = client_plan.Phase((client_plan.PERSONAL,), 1, sgd, metrics_prefix='personal')
    frozen = tff.learning.optimizers.build_sgdm(0.0)  # The global model stays put: the comparison is the personal one.
    plan = client_plan.ClientPlan(
        (personal, client_plan.Phase((client_plan.GLOBAL,), 1, frozen)),
        personal_copy=True,
        personalization=offset_personalization(),
    )
    with backends.use(backend):
        process = backends.build_classifier_process(
            plan, keras_model, element_spec=SPEC, server_optimizer=tff.learning.optimizers.build_sgdm(1.0)
        )
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    arrays = client_arrays()
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    body = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    expected = [list(body) + [np.float32(1.5)]] * len(arrays)
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        expected = offset_reference(body, expected, arrays)
    gains = [np.float32(p.trainable[-1]) for p in privates]
    # The gain trained (its gradient reached it), and `finish` capped some clients' but not all.
    assert any(abs(g - 1.5) > 1e-2 for g in gains) and 0 < gains.count(np.float32(1.6)) < len(gains), gains
    for got, want in zip(privates, expected):
        for g, w in zip(got.trainable, want):
            tolerances.assert_reordered_close(g, w, depth=NORM_DEPTH, steps=STEPS)
    # A client predicts with the same function after training.
    mixed = client_plan.personalized_weights(plan, process.get_model_weights(state), privates[0]).trainable
    s = float(privates[0].trainable[-1])
    for m, v, w in zip(mixed, privates[0].trainable[:-1], body):
        tolerances.assert_reordered_close(m, w + s * (np.asarray(v) - w), depth=3)


# ------------------------------------------------------------------ a client start of the test's own
@dataclasses.dataclass(frozen=True)
class WarmStart:
    """The global phase starts from the client's kept model after one gradient step of `rate` on its first `size`
    examples; it counts its rounds (a non-trainable extra)."""

    rate: float = 0.05
    size: int = 10

    def check(self, plan):
        del plan

    def changes(self, num_trainable):
        return list(range(num_trainable))

    def extras(self, weights):
        return tff.learning.models.ModelWeights([], [tf.constant(0)])

    def start(self, received, kept, extras, examples, gradient):
        batch = tf.nest.map_structure(lambda t: t[: self.size], examples.batch)
        wrt = list(range(len(kept.trainable)))
        _, gradients, statistics = gradient(kept.trainable, kept.non_trainable, batch, examples.mask[: self.size], wrt)
        moved = [v - self.rate * g for v, g in zip(kept.trainable, gradients)]
        return client_start.Started(
            moved, statistics, tff.learning.models.ModelWeights([], [extras.non_trainable[0] + 1])
        )

    def predicts_with(self, received, kept, extras):
        return kept


def warm_reference(body, kept, arrays):
    trained, examples = [], []
    for (x, y), v in zip(arrays, kept):
        g = _loss_and_grads(v, x[:BATCH], y[:BATCH])
        w, seen = [vi - 0.05 * gi for vi, gi in zip(v, g)], 0
        for s in range(0, len(x), BATCH):
            g = _loss_and_grads(w, x[s : s + BATCH], y[s : s + BATCH])
            w = [wi - LR * gi for wi, gi in zip(w, g)]
            seen += len(x[s : s + BATCH])
        trained.append(w)
        examples.append(seen)
    total = float(sum(examples))
    deltas = [sum(n * (t[k] - body[k]) for n, t in zip(examples, trained)) / total for k in range(len(body))]
    return [b + d for b, d in zip(body, deltas)], trained


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_client_start_written_here_runs_on_every_backend_as_a_plain_loop(backend):
    sgd = tff.learning.optimizers.build_sgdm(LR)
    plan = client_plan.ClientPlan(
        (client_plan.Phase((client_plan.GLOBAL,), 1, sgd),), personal_copy=True, global_start=WarmStart()
    )
    with backends.use(backend):
        process = backends.build_classifier_process(
            plan, keras_model, element_spec=SPEC, server_optimizer=tff.learning.optimizers.build_sgdm(1.0)
        )
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    arrays = client_arrays()
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    body = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    kept = [list(body)] * len(arrays)
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        body, kept = warm_reference(body, kept, arrays)
    assert [int(p.non_trainable[-1]) for p in privates] == [2] * len(arrays)  # Its extra counted both rounds.
    for g, w in zip(process.get_model_weights(state).trainable, body):
        tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=STEPS)
    for got, want in zip(privates, kept):  # The kept model: the one the client trained last.
        for g, w in zip(got.trainable, want):
            tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=STEPS)


# ------------------------------------------------------------------ a penalty of the test's own
@dataclasses.dataclass(frozen=True)
class Alignment:
    """``strength * sum <v, w>`` of the trained global weights v and the received ones w: pulls v against w."""

    strength: float = 0.5
    part: str = client_plan.GLOBAL
    uses_received: bool = True

    def __call__(self, trained, received):
        return self.strength * tf.add_n([tf.reduce_sum(v * w) for v, w in zip(trained[self.part], received)])


def aligned_reference(body, arrays):
    return sgd_reference(body, arrays, lambda g, body: [gi + 0.5 * bi for gi, bi in zip(g, body)])


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_penalty_written_here_runs_on_every_backend_as_a_plain_loop(backend):
    sgd = tff.learning.optimizers.build_sgdm(LR)
    plan = client_plan.ClientPlan((client_plan.Phase((client_plan.GLOBAL,), 1, sgd, penalty=Alignment()),))
    with backends.use(backend):
        process = backends.build_process(
            plan, model_fn, loss_fn=loss_fn, server_optimizer=tff.learning.optimizers.build_sgdm(1.0)
        )
    arrays = client_arrays()
    state = process.initialize()
    body = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    for _ in range(2):
        state = process.run_round(state, datasets(arrays), [process.initial_private_state()] * len(arrays)).state
        body = aligned_reference(body, arrays)
    for g, w in zip(process.get_model_weights(state).trainable, body):
        tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=STEPS)
    with pytest.raises(ValueError, match='Penalty'):
        client_plan.Phase((client_plan.GLOBAL,), 1, sgd, penalty=lambda trained, received: 0.0)


# ------------------------------------------------------------------ shared values of the test's own
@dataclasses.dataclass(frozen=True)
class LocalMomentum:
    """A server momentum m applied inside the clients' steps: every gradient gets ``beta * m``; a client keeps its
    round's mean step direction d = (x - y) / (K LR) and uploads ``m + (1 - beta) (d - m)``, so that the server's
    m becomes ``beta m + (1 - beta) mean(d)`` (SGD at learning rate 1 on the examples-weighted mean)."""

    beta: float = 0.5

    def initial(self, weights):
        return [tf.zeros_like(w) for w in weights], [tf.zeros_like(w) for w in weights]

    def offset(self, shared, kept):
        del kept
        return [self.beta * m for m in shared]

    def finish(self, received, trained, shared, kept, steps):
        del kept
        d = [(x - y) / (tf.cast(steps, tf.float32) * LR) for x, y in zip(received, trained)]
        return [m + (1 - self.beta) * (di - m) for m, di in zip(shared, d)], d


def momentum_reference(body, m, arrays, beta=0.5):
    """LocalMomentum's round written here: SGD along ``g + beta m``, then the examples-weighted means."""
    trained, examples, directions = [], [], []
    for x, y in arrays:
        w, seen, steps = [np.array(b) for b in body], 0, 0
        for s in range(0, len(x), BATCH):
            g = _loss_and_grads(w, x[s : s + BATCH], y[s : s + BATCH])
            w = [wi - LR * (gi + beta * mi) for wi, gi, mi in zip(w, g, m)]
            seen, steps = seen + len(x[s : s + BATCH]), steps + 1
        trained.append(w)
        examples.append(seen)
        directions.append([(b - wi) / (steps * LR) for b, wi in zip(body, w)])
    mean = lambda values, k: sum(n * v[k] for n, v in zip(examples, values)) / float(sum(examples))
    body = [mean(trained, k) for k in range(len(body))]
    m = [mi + (1 - beta) * (mean(directions, k) - mi) for k, mi in enumerate(m)]
    return body, m, directions


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_shared_values_written_here_run_on_every_backend_as_a_plain_loop(backend):
    sgd = tff.learning.optimizers.build_sgdm(LR)
    plan = client_plan.ClientPlan((client_plan.Phase((client_plan.GLOBAL,), 1, sgd),), shared=LocalMomentum())
    with backends.use(backend):
        process = backends.build_process(
            plan, model_fn, loss_fn=loss_fn, server_optimizer=tff.learning.optimizers.build_sgdm(1.0)
        )
    arrays = client_arrays()
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    server = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    n = len(server) // 2
    body, m, directions = server[:n], server[n:], None
    for _ in range(2):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        body, m, directions = momentum_reference(body, m, arrays)
    got = process.get_model_weights(state).trainable
    assert max(float(np.max(np.abs(v))) for v in m) > 1e-2  # The momentum moved: the offsets were not zero.
    # m and d carry the weights' rounding divided by K LR (K >= 2 steps: client_arrays' 17 examples); round 2's
    # K' <= 4 steps add beta K' LR times that to the weights: at most (1 + 0.5 * 4 / 2) = 2 times the weights' own
    # rounding (twice the steps' bound).
    for g, w in zip(got[:n], body):
        tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=2 * STEPS)
    for g, w in zip(got[n:], m):
        tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=2 * STEPS, scale=1.0 / (2 * LR))
    for private, want in zip(privates, directions):
        for g, w in zip(private.trainable, want):
            tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=2 * STEPS, scale=1.0 / (2 * LR))
    with pytest.raises(ValueError, match='SharedValues'):
        client_plan.ClientPlan((client_plan.Phase((client_plan.GLOBAL,), 1, sgd),), shared=object())


@pytest.mark.parametrize('hook', ['shared', 'reference'])
def test_a_kept_values_hook_refuses_a_plan_it_cannot_run_in(hook):
    """`ClientPlan.shared` and `ClientPlan.reference` keep values after the local weights: a personal copy, the
    other hook or a penalty on the global phase is refused by name."""
    sgd = tff.learning.optimizers.build_sgdm(0.1)
    values = {'shared': scaffold.ControlVariates(0.1), 'reference': moon.Contrast(1.0, 0.5)}
    global_phase = client_plan.Phase(('global',), 1, sgd)
    with pytest.raises(ValueError, match=f'ClientPlan.{hook} takes no personal copy'):
        client_plan.ClientPlan((global_phase,), personal_copy=True, **{hook: values[hook]})
    with pytest.raises(ValueError, match='other kept values'):
        client_plan.ClientPlan((global_phase,), **values)
    penalized = client_plan.Phase(('global',), 1, sgd, penalty=client_plan.NormPenalty('global', 0.1))
    with pytest.raises(ValueError, match=f'With ClientPlan.{hook} the global phase takes no penalty'):
        client_plan.ClientPlan((penalized,), **{hook: values[hook]})
    with pytest.raises(ValueError, match=f'ClientPlan.{hook} must be a'):
        client_plan.ClientPlan((global_phase,), **{hook: object()})
