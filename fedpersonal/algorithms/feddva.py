"""FedDVA: the federated dual variational autoencoder (Yan et al., "Personalization Disentanglement for FL").

Only the two encoders (z and c, with the c-encoder's embeddings) are federated: they are broadcast, trained on
each sampled client and averaged (FedAvg with a server optimizer, plain averaging by default). Each client's
decoder, classifier head and every batch-norm statistic are its *private state*: a `tff.CLIENTS`-placed input and
output of the round, kept between rounds in a `fedpersonal.client_state` store, never reaching a SERVER intrinsic
(as in `fedpersonal.algorithms.furl`).

A client round (fresh Adam for every phase of every round, as in the authors' code):

1. `decoder_epochs` epochs on the reconstruction loss, stepping only the decoder;
2. `z_epochs` epochs on reconstruction + KL(q(z|x) || N(0, I)), stepping only the z-encoder;
3. `c_epochs` epochs on reconstruction + the c regularizers, stepping only the c-encoder (and its embeddings);
4. optionally `head_epochs` epochs of the classifier head on [mu_z, mu_c] (a personalized head; the encoders step
   too when the model's ``head_tunes_encoders`` is set, and their change is part of the averaged update).

See `fedpersonal.models.feddva_models` for the losses. By default a round runs on the fast simulation engine
(`fedpersonal.simulation`, `_build_engine_process`): the clients of a group step in lockstep inside one TF program,
equal to the per-client path (``simulation='per_client'``) to float precision. The process has FURL's signature:

    next: (<state@SERVER, {data}@CLIENTS, {private}@CLIENTS> -> <state@SERVER, metrics@SERVER, {private}@CLIENTS>)
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any
from typing import TypeAlias

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.core import client_work
from fedpersonal.core import compose
from fedpersonal.core import process as process_lib
from fedpersonal.models import feddva_models
from fedpersonal.simulation import driver
from fedpersonal.simulation import functional
from fedpersonal.simulation import group as group_lib
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import options as simulation_options
from fedpersonal.simulation import packing

ModelWeights: TypeAlias = tff.learning.models.ModelWeights
_METRIC_TERMS = ('decoder_loss', 'z_loss', 'c_loss', 'head_loss', 'head_accuracy')


def global_weights(model: feddva_models.DualVae) -> ModelWeights:
    """The federated (encoder) variables as `ModelWeights`."""
    return ModelWeights(trainable=model.global_trainable, non_trainable=[])


def private_weights(model: feddva_models.DualVae) -> ModelWeights:
    """The private variables (decoder, head; batch-norm statistics) as `ModelWeights`."""
    return ModelWeights(trainable=model.private_trainable, non_trainable=model.private_non_trainable)


def set_weights(model: feddva_models.DualVae, global_state: Any, private_state: Any) -> None:
    """Assigns federated and private weights (eagerly or in a `tf.function`)."""
    client_work.assign(model.global_trainable, global_state.trainable)
    client_work.assign(model.private_trainable, private_state.trainable)
    client_work.assign(model.private_non_trainable, private_state.non_trainable)


def run_phase(
    model: feddva_models.DualVae,
    phase: str,
    dataset: tf.data.Dataset,
    epochs: int,
    optimizer: tff.learning.optimizers.Optimizer,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """`epochs` passes of one phase with a freshly initialized optimizer on that phase's variables.

    Must run inside a `tf.function`. Returns (examples seen, summed batch loss x batch size, correct predictions;
    the last only for the head phase). The i-th step of the phase (counting over its epochs) draws its noise with
    ``step=i`` (`feddva_models.DualVae.noise`).
    """

    def batch_loss(element) -> client_work.BatchLoss:
        step, batch = element
        loss = model.phase_loss(phase, batch['x'], batch['y'], step=step)
        return client_work.BatchLoss(loss, tf.shape(batch['x'])[0])

    def correct_after_step(element) -> collections.OrderedDict:
        return collections.OrderedDict(correct=correct_predictions(model, element[1]['x'], element[1]['y']))

    head = phase == 'head'
    result = client_work.optimizer_steps(
        model.variables_of(phase),
        dataset.repeat(epochs).enumerate(),  # Steps numbered over the phase's epochs.
        optimizer,
        batch_loss,
        epochs=1 if epochs > 0 else 0,
        zero_stats=collections.OrderedDict(correct=0.0) if head else (),
        after_step=correct_after_step if head else None,
    )
    return result.num_examples, result.loss_sum, result.stats['correct'] if head else tf.constant(0.0)


def correct_predictions(model: feddva_models.DualVae, x: tf.Tensor, y: tf.Tensor, mask: Any = None) -> tf.Tensor:
    """The number of (real, with `mask`) examples of the batch the head classifies correctly."""
    correct = tf.cast(
        tf.equal(tf.argmax(model.classify(x), axis=-1, output_type=tf.int32), tf.cast(y, tf.int32)), tf.float32
    )
    return tf.reduce_sum(correct if mask is None else correct * mask)


def client_round(
    model: feddva_models.DualVae,
    dataset: tf.data.Dataset,
    *,
    decoder_epochs: int,
    z_epochs: int,
    c_epochs: int,
    head_epochs: int,
    optimizer: tff.learning.optimizers.Optimizer,
    head_optimizer: tff.learning.optimizers.Optimizer,
) -> collections.OrderedDict:
    """The three (four) phases of a client round on `model` in place; returns summed per-phase metrics."""
    metrics = collections.OrderedDict()
    num_examples = tf.constant(0.0)
    for phase, epochs in (('decoder', decoder_epochs), ('z', z_epochs), ('c', c_epochs), ('head', head_epochs)):
        count, total, correct = run_phase(
            model, phase, dataset, epochs, head_optimizer if phase == 'head' else optimizer
        )
        count = tf.cast(count, tf.float32)
        metrics[f'{phase}_loss'] = (total, count)
        if phase == 'head':
            metrics['head_accuracy'] = (correct, count)
        num_examples = tf.maximum(num_examples, count / float(max(epochs, 1)))
    metrics['num_examples'] = (num_examples, tf.constant(1.0))
    with tf.control_dependencies([num_examples]):
        model.participations.assign_add(1)  # The next participation draws fresh noise.
    return metrics


def build_feddva(
    model_fn: Callable[[], feddva_models.DualVae],
    *,
    element_spec: Any,
    decoder_epochs: int = 1,
    z_epochs: int = 1,
    c_epochs: int = 1,
    head_epochs: int = 0,
    learning_rate: float = 1e-3,
    head_learning_rate: float = 1e-2,
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    simulation: str = 'engine',
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds the FedDVA iterative process.

    Args:
      model_fn: No-arg function returning a new `DualVae` (its variables at their initializers).
      element_spec: The client datasets' element spec: `OrderedDict(x=[None, h, w, c] float32, y=[None] int32)`.
      decoder_epochs: Epochs of phase 1 per round.
      z_epochs: Epochs of phase 2 per round.
      c_epochs: Epochs of phase 3 per round.
      head_epochs: Epochs of the personalized classifier head per round (0: no head training).
      learning_rate: Adam learning rate of phases 1-3 (the paper: 1e-3); Adam is re-initialized every phase.
      head_learning_rate: Adam learning rate of the head phase (head, and encoders if the model tunes them).
      server_optimizer: Applied to the averaged encoder update (SGD 1.0: FedAvg).
      client_weighting: `NUM_EXAMPLES` or `UNIFORM`.
      simulation: ``'engine'`` (default): a round's clients in groups, each one XLA-compiled program running every
        phase of its clients in lockstep (their private states stacked per group; `process.run_round`);
        ``'per_client'``: one TFF client computation per client. Same results to float precision. The engine
        materializes each client's phases by iterating its dataset once per phase (as the per-client path does),
        once per client id: a dataset must give the same batches every round (a fresh `tf.data` pipeline per
        round with a seeded shuffle does).
      group_size: Engine only: the most logical clients per group (default: as many as fit 1 GiB).

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess` (private state: decoder + head + batch-norm statistics +
      the participation counter).

    Example:

    >>> import collections
    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> from fedpersonal.models import feddva_models
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
    ...                                y=tf.TensorSpec([None], tf.int32))
    >>> process = algorithms.build_feddva(lambda: feddva_models.DualVae(feddva_models.SCALED), element_spec=spec)
    >>> process.stateful
    True
    """
    for name, value in (
        ('decoder_epochs', decoder_epochs),
        ('z_epochs', z_epochs),
        ('c_epochs', c_epochs),
        ('head_epochs', head_epochs),
    ):
        if value < 0:
            raise ValueError(f'{name} must be >= 0, got {value}')
    if client_weighting not in (tff.learning.ClientWeighting.NUM_EXAMPLES, tff.learning.ClientWeighting.UNIFORM):
        raise ValueError('client_weighting must be NUM_EXAMPLES or UNIFORM')

    @tff.tensorflow.computation
    def initial_global_weights():
        return global_weights(model_fn())

    @tff.tensorflow.computation
    def initial_private_state():
        return private_weights(model_fn())

    weights_type = initial_global_weights.type_signature.result
    private_type = initial_private_state.type_signature.result
    dataset_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
    optimizer = tff.learning.optimizers.build_adam(learning_rate=learning_rate)
    head_optimizer = tff.learning.optimizers.build_adam(learning_rate=head_learning_rate)
    simulation_options.check_simulation(simulation)
    if simulation == 'engine':
        return _build_engine_process(
            model_fn,
            element_spec=element_spec,
            epochs=collections.OrderedDict(decoder=decoder_epochs, z=z_epochs, c=c_epochs, head=head_epochs),
            optimizers=collections.OrderedDict(decoder=optimizer, z=optimizer, c=optimizer, head=head_optimizer),
            server_optimizer=server_optimizer,
            client_weighting=client_weighting,
            group_size=group_size,
            initial_global_weights=initial_global_weights,
            initial_private_state=initial_private_state,
        )

    @tff.tensorflow.computation(weights_type, dataset_type, private_type)
    @tf.function
    def client_update(server_weights, dataset, private_state):
        with tf.init_scope():
            model = client_work.construct(model_fn)
        set_weights(model, server_weights, private_state)
        metrics = client_round(
            model,
            dataset,
            decoder_epochs=decoder_epochs,
            z_epochs=z_epochs,
            c_epochs=c_epochs,
            head_epochs=head_epochs,
            optimizer=optimizer,
            head_optimizer=head_optimizer,
        )
        delta, has_non_finite = client_work.weights_delta(server_weights.trainable, model.global_trainable)
        num_examples = metrics['num_examples'][0]
        weight = client_work.client_weight(client_weighting, num_examples, (), has_non_finite)
        new_private = client_work.keep_previous_if_non_finite(has_non_finite, private_state, private_weights(model))
        sums = collections.OrderedDict((k, tf.stack(v)) for k, v in metrics.items())
        return tff.learning.templates.ClientResult(update=delta, update_weight=weight), sums, new_private

    return compose.compose_personalized_process(
        initial_global_weights=initial_global_weights,
        initial_private_state=initial_private_state,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(client_update.type_signature.result[1]),
    )


def _phases_as_tff_sees(element_spec: Any, epochs: collections.OrderedDict) -> Callable[[tf.data.Dataset], tuple]:
    """``dataset -> (phase datasets...)``: the batches of every phase exactly as the per-client path iterates them.

    The per-client path iterates its dataset once per phase (``repeat(epochs)``); a dataset shuffled with
    ``reshuffle_each_iteration`` gives every phase another order. TFF serializes the dataset for every call, so each
    round starts from the first order, however often the Python object was iterated. Iterating it the same way
    inside a TFF computation gives the same batches.
    """

    leaves = tf.nest.flatten(element_spec)

    @tff.tensorflow.computation(tff.SequenceType(tff.types.tensorflow_to_type(element_spec)))
    @tf.function(autograph=False)  # Its automatic control dependencies iterate the phases in order.
    def collect(dataset):
        def append(state, batch):  # Rows in TensorArrays: no quadratic copying.
            rows, sizes = state
            flat = tf.nest.flatten(batch)
            rows = tuple(ta.write(ta.size(), leaf) for ta, leaf in zip(rows, flat))
            return rows, sizes.write(sizes.size(), tf.shape(flat[0])[0])

        phases = []
        for phase_epochs in epochs.values():
            if phase_epochs:  # Iterated as `run_phase` iterates it.
                empty = tuple(
                    tf.TensorArray(s.dtype, 0, True, infer_shape=False, element_shape=s.shape) for s in leaves
                )
                initial = (empty, tf.TensorArray(tf.int32, 0, True, element_shape=[]))
                rows, sizes = dataset.repeat(phase_epochs).enumerate().reduce(initial, lambda s, b: append(s, b[1]))
                phases.append((tuple(ta.concat() for ta in rows), sizes.stack()))
        return tuple(phases)

    def phase_datasets(dataset: tf.data.Dataset) -> tuple[tf.data.Dataset, ...]:
        collected = iter(collect(dataset))
        out = []
        for phase_epochs in epochs.values():
            if phase_epochs:
                rows, sizes = next(collected)
                bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
                batches = [[leaf[a:b] for leaf in rows] for a, b in zip(bounds[:-1], bounds[1:])]
                out.append(_batches_dataset(batches, element_spec))
            else:
                out.append(dataset.take(0))
        return tuple(out)

    return phase_datasets


def _batches_dataset(batches: list[list[np.ndarray]], element_spec: Any) -> tf.data.Dataset:
    """A dataset yielding the given batches (flat leaves) as `element_spec` structures."""
    flat_spec = tf.nest.flatten(element_spec)
    generator = lambda: (tuple(batch) for batch in batches)
    dataset = tf.data.Dataset.from_generator(generator, output_signature=tuple(flat_spec))
    return dataset.map(lambda *leaves: tf.nest.pack_sequence_as(element_spec, list(leaves)))


def _variables_of(model: feddva_models.DualVae, phase: str) -> list[tf.Variable]:
    return model.variables_of(phase)


def _groups(model: feddva_models.DualVae) -> tuple[list[tf.Variable], ...]:
    """FedDVA's weights as `functional.Parts`: encoders global; decoder, head, statistics and counter local."""
    return model.global_trainable, [], model.private_trainable, model.private_non_trainable


def _build_engine_process(
    model_fn,
    *,
    element_spec,
    epochs,
    optimizers,
    server_optimizer,
    client_weighting,
    group_size,
    initial_global_weights,
    initial_private_state,
) -> process_lib.PersonalizedProcess:
    """FedDVA on the fast simulation engine: every phase of a group of clients in lockstep, one TF program.

    A step of a client is the per-client path's step on the same batch: the dual VAE rebuilt from the client's
    weights (`functional.FunctionalModel`, its batch norms recording their moving-statistic updates) computes the
    phase loss and its gradient on the client's real examples only (the packed batch sliced to them, so batch
    norms and every batch statistic of the loss see exactly the per-client batch), with the same noise
    (`feddva_models.reparameterization_noise` of the batch, the participation count and the step index).

    The group runs as one TF graph without XLA: a client's convolutions use its own filters, which neither `pfor`
    nor TF's CPU kernels batch over clients, so the clients of a step run in a loop, and XLA's CPU convolutions were
    4-5x slower than TF's (oneDNN) ones (configs/feddva_scaled.flags on MNIST: 17 s per round against 3.5 s).
    """
    model = functional.FunctionalModel(model_fn, groups=_groups, batch_norm=True)
    seed, arch = model.template.seed, model.template.arch
    initial = model.initial_weights
    phase_slots = {
        phase: model.slots_of(functools.partial(_variables_of, phase=phase)) for phase in feddva_models.PHASES
    }
    counter_slot = model.slots_of(lambda m: [m.participations])[0]
    per_client_arrays = (
        list(initial.global_trainable) + list(initial.local_trainable) + list(initial.local_non_trainable)
    )
    packer = packing.ClientPacker(
        _phases_as_tff_sees(element_spec, epochs),
        feddva_models.PHASES,
        element_spec,
        group_size or simulation_options.default_group_size(per_client_arrays),
    )
    weights_type = initial_global_weights.type_signature.result
    group_private_type = packing.stacked_type(initial_private_state.type_signature.result)

    def real_examples(batch, mask):
        """The batch's real examples (packed first); one padded example for a client without a batch at this step
        (its step is computed and discarded, a batch of one keeps every statistic finite)."""
        n = tf.maximum(tf.cast(tf.reduce_sum(mask), tf.int32), 1)
        return tf.nest.map_structure(lambda t: t[:n], batch)

    def client_loss_fn(phase: str):
        def client_loss(parts, batch, mask, step):
            batch = real_examples(batch, mask)
            x, y = batch['x'], batch['y']
            rebuilt = model.rebuild(parts)
            if phase == 'head':  # No sampling in the head phase.
                n = tf.shape(x)[0]
                noise = (tf.zeros([n, arch.z_dim]), tf.zeros([n, arch.c_dim]))
            else:
                participations = parts[counter_slot[0]][counter_slot[1]]
                noise = feddva_models.reparameterization_noise(seed, arch, phase, x, participations, step)
            return rebuilt.model.phase_terms(phase, x, *noise, y)['loss'], rebuilt.updates

        return client_loss

    def correct_after_step(parts, batch, mask, step):
        del step
        batch = real_examples(batch, mask)
        correct = correct_predictions(model.rebuild(parts).model, batch['x'], batch['y'])
        return collections.OrderedDict(correct=correct)

    @tf.function(autograph=False)
    def group_work(server_weights, group, private_states):
        received, private_trainable = list(server_weights.trainable), list(private_states.trainable)
        private_non_trainable = list(private_states.non_trainable)
        weights = functional.Parts(received, [], private_trainable, private_non_trainable)
        clients = tf.shape(group['decoder']['mask'])[0]
        sums: collections.OrderedDict = collections.OrderedDict()
        zeros = tf.zeros([clients])
        num_examples = zeros
        for phase, phase_epochs in epochs.items():
            count, loss_sum, correct = zeros, zeros, zeros
            if phase_epochs > 0 and phase_slots[phase]:
                data = group[phase]
                steps = tf.shape(data['mask'])[1]
                weights, result = lockstep.lockstep_steps(
                    model,
                    weights,
                    phase_slots[phase],
                    data,
                    optimizers[phase],
                    client_loss=client_loss_fn(phase),
                    step_inputs=tf.broadcast_to(tf.range(steps, dtype=tf.int64)[tf.newaxis], [clients, steps]),
                    after_step=correct_after_step if phase == 'head' else None,
                    zero_stats=collections.OrderedDict(correct=0.0) if phase == 'head' else (),
                    vectorize=False,  # Per-client convolution filters: a loop over the clients.
                )
                count, loss_sum = result.num_examples, result.loss_sum
                correct = result.stats['correct'] if phase == 'head' else zeros
            sums[f'{phase}_loss'] = tf.stack([tf.reduce_sum(loss_sum), tf.reduce_sum(count)])
            if phase == 'head':
                sums['head_accuracy'] = tf.stack([tf.reduce_sum(correct), tf.reduce_sum(count)])
            num_examples = tf.maximum(num_examples, count / float(max(phase_epochs, 1)))
        has_data = tf.reduce_sum(tf.cast(group['decoder']['steps'] > 0, tf.float32))
        sums['num_examples'] = tf.stack([tf.reduce_sum(num_examples), has_data])  # The denominator is unused.
        trained = [
            lockstep.per_client(w, b, clients) for w, b in zip(weights.global_trainable, initial.global_trainable)
        ]
        weight = group_lib.client_weights(client_weighting, num_examples)
        update = group_lib.weighted_update(received, trained, weight)
        finite = group_lib.client_finite(received, trained)  # Else the client keeps its previous private state.
        new_private = []
        for group_index, previous_values in (
            (functional.LOCAL_TRAINABLE, private_trainable),
            (functional.LOCAL_NON_TRAINABLE, private_non_trainable),
        ):
            for i, previous in enumerate(previous_values):
                value = lockstep.per_client(weights[group_index][i], initial[group_index][i], clients)
                if (group_index, i) == counter_slot:
                    value += 1  # The next participation draws fresh noise.
                keep = tf.reshape(finite, [-1] + [1] * (value.shape.rank - 1))
                new_private.append(tf.where(keep, value, tf.cast(previous, value.dtype)))
        num_trainable = len(private_trainable)
        private = ModelWeights(trainable=new_private[:num_trainable], non_trainable=new_private[num_trainable:])
        return update, sums, private

    client_update = lambda: tff.tensorflow.computation(weights_type, packer.group_type(), group_private_type)(
        group_work
    )
    runner = driver.GroupRoundRunner(group_work, server_optimizer, driver.finalize_ratios)
    return compose.compose_personalized_process(
        initial_global_weights=initial_global_weights,
        initial_private_state=initial_private_state,
        client_update=client_update,
        model_aggregator=tff.aggregators.MeanFactory(),
        server_optimizer=server_optimizer,
        aggregate_metrics=compose.ratio_metrics(),
        packer=packer,
        round_runner=runner,
        group_private_state_type=group_private_type,
    )
