"""The workloads of `simulation_speed.py`: what a row of each one builds and runs, and its analytic FLOPs.

Every workload is a ``*_setup()`` returning a `Setup` (built in the row process, which imports TensorFlow) plus a
`WORKLOADS` entry (description, rows, baseline, skip reason checked by the parent without TensorFlow):

``mf``: generated MovieLens-shaped MF as in the reference (1,000 users, 3,700 items, 100 ratings each, dim 50),
100 clients per round, batch 5, ``ReconstructionSplit(0.5, strategy='order', recon_epochs=5)``: 50
reconstruction + 10 update SGD steps, client and reconstruction lr 0.1, server 1.0. ``mf_table1``: the Table 1
FedRecon round (``fedpersonal.tasks.movielens_mf`` defaults) on MovieLens 100K from ``--data_dir``; without the
data it is skipped with the reason printed and recorded (never replaced by generated data). Both have the four
rows ``tff``, ``per_client``, ``engine`` and ``limit`` (`simulation_limit.MFLimit`).
``nwp``: FedRecon of the next-word-prediction task (``fedpersonal.tasks.next_word_prediction``) on its Shakespeare
configuration: ``NextWordPredictionConfig`` defaults with ``dataset='shakespeare'`` (first vocabulary size, 1,000
words + 500 local OOV buckets, LSTM 64, embedding 32, 20 tokens, batch 16, <= 128 sequences per client, 10 clients
per round, Yogi server) on the training roles of ``../shared/data/shakespeare``, built by the task's own
``build_fed_recon`` (so with the Table 2 binary's communication measurement: the measured broadcast and aggregator
per client, ``measure_communication`` on the engine). ``furl``: FURL (``fedpersonal.algorithms.build_furl``, as
``fedpersonal.tasks.furl_personalization.run_personalized_fl`` builds it) on ``configs/furl_assistments.flags``
with ``../shared/data/assist-a0910`` (10 students per round, one local epoch, user embedding 8). ``hpfl``: HPFL
(both aggregations) on ``configs/hpfl_assist.flags``, all 40 silos every round. ``feddva``: FedDVA
(heterogeneous inputs) on ``configs/feddva_scaled.flags`` with ``../shared/data/mnist``, 10 of 20 clients per
round (`fedpersonal.tasks.feddva_workload`). These have rows ``per_client`` and ``engine`` only; without their data
they are skipped with the reason (never generated data).

``compute_bound_s`` of a row is its workload's ``round_flops`` (only the real examples, matmuls and convolutions
at 2 FLOPs per multiply-add: `simulation_limit.mf_round_flops`, `_nwp_round_flops`, `_furl_round_flops`, `_hpfl_round_flops`,
`_feddva_round_flops`) at a float32 matmul's measured FLOP rate.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import simulation_limit  # A sibling module (benchmarks/ is on sys.path when simulation_speed.py runs).
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SHARED_DATA = os.path.normpath(os.path.join(_REPO, '..', 'shared', 'data'))  # The project's data copies.
DATA_DIR = flags.DEFINE_string('data_dir', None, 'Directory holding MovieLens 100K u.data (for mf_table1).')


# ------------------------------------------------------------------------------------------------ workloads
@dataclasses.dataclass
class Setup:
    """What the rows of one workload need (built in the row process: it imports TensorFlow)."""

    client_ids: list[str]
    dataset_fn: Callable[[str], Any]  # client id -> batched tf.data.Dataset
    clients_per_round: int
    build_fedpersonal: Callable[[str], tuple[Any, dict]]  # simulation -> (PersonalizedProcess, info)
    build_tff: Callable[[], Any] | None = None  # -> tff.learning.templates.LearningProcess
    build_limit: Callable[[], Any] | None = None  # -> an object like simulation_limit.MFLimit
    round_flops: Callable[[list[str]], float] | None = None  # sampled client ids -> FLOPs of their round
    seed: int = 0
    initial_private_state: Callable[[str], Any] | None = None  # client id -> its first private state (HPFL)

    def sample(self, round_num: int) -> list[str]:
        from fedpersonal import program

        return program.sample_clients(self.client_ids, self.clients_per_round, round_num=round_num, seed=self.seed)


@dataclasses.dataclass(frozen=True)
class Workload:
    description: str
    setup: Callable[[], Setup]
    rows: tuple[str, ...] = ('per_client', 'engine')
    baseline: str = 'per_client'  # The rows get speedup_vs_<baseline>.
    skip_reason: Callable[[], str | None] = lambda: None  # Checked by the parent (no TensorFlow there).


def _mf_setup(
    client_ids, dataset_fn, model_fn, split, lrs, batch, max_examples, num_items, dim, cpr, group_size=None
) -> Setup:
    """A FedRecon MF `Setup` (all four rows); lrs = (client, reconstruction, server) SGD learning rates; the engine
    row with `group_size` clients per group (None: the builder's default).

    No metrics beyond the loss and example count in any row (`metrics_fn=None`): the same work everywhere."""
    import tensorflow as tf
    import tensorflow_federated as tff

    from fedpersonal import algorithms

    sgd = [tff.learning.optimizers.build_sgdm(lr) for lr in lrs]
    mse = tf.keras.losses.MeanSquaredError

    def build_fedpersonal(simulation: str) -> tuple[Any, dict]:
        kwargs = dict(zip(('client_optimizer', 'reconstruction_optimizer', 'server_optimizer'), sgd))
        kwargs.update(loss_fn=mse, metrics_fn=None, dataset_split=split)
        if group_size is not None and simulation == 'engine':
            kwargs.update(group_size=group_size)
        try:
            return algorithms.build_fed_recon(model_fn, simulation=simulation, **kwargs), {'simulation_arg': True}
        except TypeError as e:  # A builder that predates `simulation=` is the per-client path.
            if simulation != 'per_client' or 'simulation' not in str(e):
                raise
            return algorithms.build_fed_recon(model_fn, **kwargs), {'simulation_arg': False}

    def build_tff():
        optimizers = dict(zip(('client_optimizer_fn', 'reconstruction_optimizer_fn', 'server_optimizer_fn'), sgd))
        split_fn = algorithms.build_dataset_split_fn(split)
        return tff.learning.algorithms.build_fed_recon(model_fn, loss_fn=mse, dataset_split_fn=split_fn, **optimizers)

    limit = simulation_limit.MFLimit(dataset_fn, model_fn, split, lrs, batch, max_examples)
    flops = lambda ids: simulation_limit.mf_round_flops([limit.client_arrays(c) for c in ids], dim, num_items)
    return Setup(client_ids, dataset_fn, cpr, build_fedpersonal, build_tff, lambda: limit, flops)


def mf_setup(group_size: int | None = None) -> Setup:
    """Generated MovieLens-shaped MF, drawn as in ../shared/reference/limit_fedrecon_mf.py."""
    import tensorflow as tf

    from fedpersonal import algorithms
    from fedpersonal.models import matrix_factorization as mf

    users, num_items, per_user, dim, batch = 1000, 3700, 100, 50, 5
    rng = np.random.default_rng(0)
    u_true, v_true = rng.normal(0, 0.5, (users, 8)), rng.normal(0, 0.5, (num_items, 8))
    pop = 1.0 / np.arange(1, num_items + 1) ** 0.8
    pop /= pop.sum()
    data = {}
    for u in range(users):
        items = rng.choice(num_items, size=per_user, replace=False, p=pop)
        noisy = 3.5 + u_true[u] @ v_true[items].T + rng.normal(0, 0.5, per_user)
        data[str(u)] = collections.OrderedDict(
            item_id=items.astype(np.int64), rating=np.clip(np.round(noisy), 1, 5).astype(np.float32)
        )

    def dataset_fn(cid: str) -> tf.data.Dataset:  # As fedpersonal/tasks/movielens_mf.py builds client datasets.
        return tf.data.Dataset.from_tensor_slices(data[cid]).map(mf.personal_example).batch(batch)

    split = algorithms.ReconstructionSplit(support_fraction=0.5, strategy='order', recon_epochs=5)
    model_fn = mf.personal_model_fn(num_items=num_items, num_latent_factors=dim)
    args = (split, (0.1, 0.1, 1.0), batch, per_user, num_items, dim, 100)
    return _mf_setup(list(data), dataset_fn, model_fn, *args, group_size=group_size)


def _ml100k_missing() -> str | None:
    if not DATA_DIR.value:
        return 'no --data_dir (`bash ../shared/data/fetch-movielens-100k /tmp/ml-100k`, then --data_dir=/tmp/ml-100k)'
    if not os.path.isfile(os.path.join(DATA_DIR.value, 'u.data')):
        return f'no MovieLens 100K u.data in --data_dir={DATA_DIR.value}'
    return None


def mf_table1_setup() -> Setup:
    """The FedRecon row of Table 1 (`MovieLensMFConfig` defaults) on MovieLens 100K's training users."""
    from fedpersonal.tasks import movielens_mf

    config = movielens_mf.MovieLensMFConfig(data_dir=DATA_DIR.value, variant='100k')
    assert (config.client_optimizer, config.reconstruction_optimizer, config.server_optimizer) == ('sgd',) * 3
    prepared = movielens_mf.load_data(config)
    task = movielens_mf.MovieLensMFTask(config, prepared)
    train = prepared.user_train
    dataset_fn = lambda cid: task.personal_dataset_fn(train.create_tf_dataset_for_client(cid))
    lrs = (config.client_learning_rate, config.reconstruction_learning_rate, config.server_learning_rate)
    max_examples = int(prepared.user_split_ratings['train'].groupby('user_id').size().max())
    args = (task.personal_model_fn, config.split, lrs, config.batch_size, max_examples, task.num_items)
    return _mf_setup(list(train.client_ids), dataset_fn, *args, config.num_latent_factors, config.clients_per_round)


def _missing(directory: str, *names: str) -> str | None:
    absent = [n for n in names if not os.path.isfile(os.path.join(directory, n))]
    return f'no {", ".join(absent)} in {directory} (see ../shared/data/README.md)' if absent else None


def _count_examples(batches: list[Any]) -> int:
    import tensorflow as tf

    return int(sum(len(tf.nest.flatten(b)[0]) for b in batches))


def nwp_setup() -> Setup:
    """FedRecon of the NWP task (`NextWordPredictionConfig` defaults, dataset='shakespeare'), first vocabulary."""
    import dataclasses as dc

    from fedpersonal.data import dataset_split
    from fedpersonal.tasks import next_word_prediction as nwp_task

    config = nwp_task.NextWordPredictionConfig(
        dataset='shakespeare', data_dir=os.path.join(_SHARED_DATA, 'shakespeare'), output_dir=tempfile.gettempdir()
    )
    corpus = nwp_task.load_corpus(config)
    vocab_size, buckets = config.vocab_sizes[0], config.num_oov_buckets
    task = nwp_task.NextWordPredictionTask(config, corpus, vocab_size)
    train = task.client_data(buckets, 'train')
    dataset_fn = lambda cid: task.dataset_fn(train.create_tf_dataset_for_client(cid))

    def build_fedpersonal(simulation: str) -> tuple[Any, dict]:
        row_task = nwp_task.NextWordPredictionTask(dc.replace(config, simulation=simulation), corpus, vocab_size)
        return row_task.build_fed_recon(buckets), {'simulation_arg': True}

    variables = [(v.name, v.shape) for v in task.model_fn(buckets, oov_local=True)().global_trainable_variables]
    global_params = sum(int(np.prod(s)) for _, s in variables)
    # The matmul weights every token meets: the LSTM's input and recurrent kernels, the projection and the logits.
    per_token_weights = sum(int(np.prod(s)) for name, s in variables if 'kernel' in name)
    counts: dict[str, tuple[int, int, int]] = {}

    def client_counts(cid: str) -> tuple[int, int, int]:  # (support examples, query examples, query steps)
        if cid not in counts:
            support, query = dataset_split.split_batches(list(dataset_fn(cid).as_numpy_iterator()), config.split)
            counts[cid] = (_count_examples(support), _count_examples(query), len(query))
        return counts[cid]

    flops = lambda ids: _nwp_round_flops(
        [client_counts(c) for c in ids], config.max_sequence_length, per_token_weights, global_params
    )
    ids = list(train.client_ids)
    return Setup(ids, dataset_fn, config.clients_per_round, build_fedpersonal, round_flops=flops, seed=config.seed)


def _nwp_round_flops(counts: list[tuple[int, int, int]], length: int, per_token_weights: int, params: int) -> float:
    """Analytic FLOPs of one NWP FedRecon round, real examples only (every example is `length` tokens long).

    A token's forward pass is 2 FLOPs per multiply-add of each matmul weight it meets (LSTM input and recurrent
    kernels, projection, logits; embedding lookups, gates and softmax left out): F = 2 * per_token_weights. A
    reconstruction example costs 2F per token (forward, and the backward pass to the OOV rows without weight
    gradients), an update example 3F (forward, backward to activations and to weights); each update step's SGD
    2 per global parameter (dense), each client's delta and weighting 3 per global parameter, the server's
    mean and Yogi step ~10 per global parameter.
    """
    forward = 2.0 * per_token_weights * length
    flops = 10.0 * params
    for support, query, query_steps in counts:
        flops += 2 * forward * support + 3 * forward * query + 2.0 * params * query_steps + 3.0 * params
    return float(flops)


def flagfile_config(config_cls, flagfile: str, *extra_flags: str):
    """A task config from `configs/<flagfile>` and `extra_flags` (e.g. the shared data copy), output to /tmp."""
    from absl import flags as absl_flags

    from fedpersonal.program import config_flags

    values = absl_flags.FlagValues()
    config_flags.define_flags(config_cls, flag_values=values)
    flagfile = os.path.join(_REPO, 'configs', flagfile)
    values(['benchmark', f'--flagfile={flagfile}', *extra_flags, f'--output_dir={tempfile.gettempdir()}'])
    return config_flags.config_from_flags(config_cls, flag_values=values)


def _assist_config(config_cls, flagfile: str):
    """A task config from `configs/<flagfile>` with the shared ASSISTments copy as its data."""
    return flagfile_config(config_cls, flagfile, f'--data_dir={os.path.join(_SHARED_DATA, "assist-a0910")}')


def furl_config():
    """`FurlConfig` from configs/furl_assistments.flags with the shared ASSISTments copy."""
    from fedpersonal.tasks import furl_personalization

    return _assist_config(furl_personalization.FurlConfig, 'furl_assistments.flags')


def furl_setup(group_size: int | None = None) -> Setup:
    """FURL (personalized FL row of the FURL task) on its ASSISTments configuration (`group_size`: the engine's
    clients per group, default the configuration's)."""
    from fedpersonal.algorithms import furl
    from fedpersonal.program import optimizers
    from fedpersonal.tasks import furl_personalization

    config = furl_config()
    data = furl_personalization.load_data(config)
    task = furl_personalization.FurlTask(config, data)
    dataset_fn = lambda cid: task.dataset_fn(data.train.create_tf_dataset_for_client(cid))
    model_fn = task.model_fn('private')

    def build_fedpersonal(simulation: str) -> tuple[Any, dict]:  # As run_personalized_fl builds it.
        kwargs = dict(
            loss_fn=task.loss_fn,
            metrics_fn=task.metrics_fn,
            client_optimizer=optimizers.build_optimizer(config.client_optimizer, config.client_learning_rate),
            server_optimizer=optimizers.build_optimizer(config.server_optimizer, config.server_learning_rate),
            client_epochs=config.client_epochs,
            private_norm_regularization=config.private_norm_regularization,
            group_size=group_size or config.group_size,
        )
        return furl.build_furl(model_fn, simulation=simulation, **kwargs), {'simulation_arg': True}

    if data.max_chars > 0:  # The analytic count below has no text encoder (ASSISTments has no text).
        flops = None
    else:
        model = model_fn()
        variables = [(v.name, tuple(v.shape)) for v in model.global_trainable_variables]
        table = next(s for n, s in variables if 'item_embedding' in n)  # [num_items, item dimension]
        sizes = dict(
            kernels=sum(int(np.prod(s)) for n, s in variables if 'kernel' in n),
            dense=sum(int(np.prod(s)) for n, s in variables if 'item_embedding' not in n),
            private=sum(int(np.prod(v.shape)) for v in model.local_trainable_variables),
        )
        counts: dict[str, tuple[int, int]] = {}

        def client_counts(cid: str) -> tuple[int, int]:  # (examples, steps) of one local epoch
            if cid not in counts:
                batches = list(dataset_fn(cid).as_numpy_iterator())
                counts[cid] = (_count_examples(batches), len(batches))
            return counts[cid]

        flops = lambda ids: _furl_round_flops([client_counts(c) for c in ids], config.client_epochs, table, **sizes)
    ids = list(data.client_ids)
    return Setup(ids, dataset_fn, config.clients_per_round, build_fedpersonal, round_flops=flops, seed=config.seed)


def _furl_round_flops(
    counts: list[tuple[int, int]], epochs: int, table: tuple[int, int], *, kernels: int, dense: int, private: int
) -> float:
    """Analytic FLOPs of one FURL round without a text encoder (ASSISTments), real examples only.

    An example's forward pass is 2 FLOPs per multiply-add of the MLP and logits kernels (F = 2 * kernels; the
    lookups and concatenation left out); forward + backward 3F. Each local step's SGD costs 2 per dense global
    parameter and per private parameter, plus 2 per value of the item-embedding rows it looks up (one per
    example); each client's delta and weighting 3 per dense parameter and per value of a looked-up row; the
    server's mean and SGD step 3 per global parameter (the whole item table).
    """
    rows, row = table
    flops = 3.0 * (dense + rows * row)
    for examples, steps in counts:
        examples, steps = examples * epochs, steps * epochs
        flops += 3 * 2.0 * kernels * examples + steps * 2.0 * (dense + private) + 2.0 * row * examples
        flops += 3.0 * (dense + row * min(examples, rows))
    return float(flops)


def hpfl_setup() -> Setup:
    """HPFL (both aggregations) on its ASSISTments configuration: 40 silos, every silo every round."""
    from fedpersonal.algorithms import hpfl
    from fedpersonal.models import gum
    from fedpersonal.tasks import hpfl_user_modeling as task

    config = _assist_config(task.HpflConfig, 'hpfl_assist.flags')
    data = task.load_data(config)
    gum_config = gum.GumConfig.for_data(data, hidden_dim=config.hidden_dim)
    ids = [silo.client_id for silo in data.silos]
    client_data = dict(zip(ids, hpfl.federated_data(data, gum_config, batch_size=config.batch_size, seed=config.seed)))
    initial = dict(zip(ids, hpfl.initial_client_states(data, gum_config, public_seed=config.seed, seed=config.seed)))

    def build_fedpersonal(simulation: str) -> tuple[Any, dict]:  # As the HPFL task builds its 'hpfl' row.
        configured = dataclasses.replace(config, simulation=simulation)
        return task._build_process('hpfl', configured, gum_config, len(ids)), {'simulation_arg': True}

    silos = {silo.client_id: silo for silo in data.silos}
    sizes = dict(
        users=gum_config.max_users,
        k=gum_config.num_attributes,
        h=gum_config.hidden_dim,
        local=config.max_local_clusters,
        centres=config.max_global_clusters,
        iterations=config.kmeans_iterations,
        batch=config.batch_size,
        epochs=config.client_epochs,
    )

    def silo_counts(cid: str) -> tuple[int, int, int]:  # (train examples, validation examples, items)
        split = np.asarray(silos[cid].split)
        return int((split == 0).sum()), int((split == 1).sum()), int(silos[cid].num_items)

    flops = lambda ids: _hpfl_round_flops([silo_counts(c) for c in ids], max_items=gum_config.max_items, **sizes)
    return Setup(
        ids,
        client_data.__getitem__,
        len(ids),
        build_fedpersonal,
        round_flops=flops,
        seed=config.seed,
        initial_private_state=initial.get,
    )


def _hpfl_round_flops(counts, *, max_items, users, k, h, local, centres, iterations, batch, epochs) -> float:
    """Analytic FLOPs of one HPFL round with each silo's item tables at the engine's cut (a power of 2 >= its items).

    Per silo with e training examples over s = ceil(e / batch) steps per epoch, v validation examples and P table and
    public parameters: forward + backward 3F per example with F = 2 (K^2 + 2 K h) (the attribute product and the
    two projections), dense Adam 10 per parameter per step, validation F per example; k-means of the items (and of
    the users): maximin 3 K per row per centre, each Lloyd iteration 4 K per row per centre (distances and means);
    the fine-grained update 4 K per row per global centre. The server's work (a few thousand centres) is left out.
    """
    per_example = 2.0 * (k * k + 2 * k * h)
    flops = 0.0
    for examples, validation, items in counts:
        rows = min(max_items, max(16, 1 << max(0, items - 1).bit_length()))
        params = users * k + rows * (k + 3) + 2 * k * h + k * k
        steps = -(-examples // batch) * epochs
        flops += 3 * per_example * examples * epochs + 10.0 * params * steps + per_example * validation
        for table_rows in (rows, users):
            flops += table_rows * k * local * (3.0 + 4.0 * iterations) + 4.0 * table_rows * k * centres
    return float(flops)


def feddva_setup() -> Setup:
    """FedDVA (heterogeneous inputs, the head on fixed [z, c]) on configs/feddva_scaled.flags with MNIST."""
    from fedpersonal.tasks import feddva as feddva_task
    from fedpersonal.tasks import feddva_workload

    config = flagfile_config(
        feddva_task.FeddvaConfig,
        'feddva_scaled.flags',
        '--dataset=mnist',
        f'--data_dir={os.path.join(_SHARED_DATA, "mnist")}',
    )
    workload = feddva_workload.round_workload(config)
    task = workload.task
    epochs = dict(decoder=config.decoder_epochs, z=config.z_epochs, c=config.c_epochs, head=config.head_epochs)
    per_batch = _feddva_batch_flops(task.dva_fn(False), config.batch_size, task.data.image_shape)
    sizes = {cid: _count_examples(list(workload.dataset_fn(cid).as_numpy_iterator())) for cid in workload.client_ids}
    flops = lambda ids: _feddva_round_flops([sizes[c] for c in ids], config.batch_size, per_batch, epochs)
    build = lambda simulation: (workload.build(simulation), {'simulation_arg': True})
    return Setup(
        workload.client_ids,
        workload.dataset_fn,
        workload.clients_per_round,
        build,
        round_flops=flops,
        seed=workload.seed,
    )


def _feddva_batch_flops(model: Any, batch: int, image_shape: tuple[int, ...]) -> dict[str, float]:
    """FLOPs of one training step (loss, gradients of the phase's variables) of each FedDVA phase on a full batch.

    Counted on the traced step's graph by TensorFlow's profiler (``float_operation``: MatMul, Conv2D, element-wise
    ops), plus the convolution gradients it has no count for: a ``Conv2DBackpropInput`` (also the forward pass of a
    transposed convolution) or ``Conv2DBackpropFilter`` costs 2 x the elements of its output gradient x the
    filter's kh * kw * in_channels, as the convolution it differentiates; plus Adam's update, 10 FLOPs per
    trained parameter.
    """
    import tensorflow as tf

    x = tf.TensorSpec([batch, *image_shape], tf.float32)
    y = tf.TensorSpec([batch], tf.int32)
    model.phase_loss('decoder', tf.zeros(x.shape), tf.zeros(y.shape, tf.int32), 0)  # Builds the variables.
    options = tf.compat.v1.profiler.ProfileOptionBuilder(tf.compat.v1.profiler.ProfileOptionBuilder.float_operation())
    options = options.with_empty_output().build()
    per_batch = {}
    for phase in ('decoder', 'z', 'c', 'head'):
        variables = model.variables_of(phase)

        @tf.function
        def step(x, y, phase=phase, variables=variables):
            with tf.GradientTape() as tape:
                loss = model.phase_loss(phase, x, y, 0)
            return tape.gradient(loss, variables)

        graph = step.get_concrete_function(x, y).graph
        flops = float(tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops)
        for op in graph.get_operations():
            if op.type in ('Conv2DBackpropInput', 'Conv2DBackpropFilter'):
                out_grad, filter_shape = (
                    op.inputs[2].shape,
                    (op.inputs[1] if 'Input' in op.type else op.outputs[0]).shape,
                )
                flops += 2.0 * out_grad.num_elements() * filter_shape[0] * filter_shape[1] * filter_shape[2]
        per_batch[phase] = flops + 10.0 * sum(int(np.prod(v.shape)) for v in variables)
    return per_batch


def _feddva_round_flops(examples: list[int], batch: int, per_batch: dict[str, float], epochs: dict[str, int]) -> float:
    """FLOPs of one FedDVA round: per client and phase, its epochs x its batches at `_feddva_batch_flops` (a
    partial last batch counted in proportion to its examples). The server's mean of the encoders is left out."""
    return float(sum(e / batch * per_batch[p] * epochs[p] for e in examples for p in per_batch))


MF_ROWS = ('tff', 'per_client', 'engine', 'limit')
WORKLOADS: dict[str, Workload] = {
    'mf': Workload('generated MovieLens-shaped MF, dim 50', mf_setup, MF_ROWS, 'tff'),
    'mf_table1': Workload('Table 1 round, ML-100K', mf_table1_setup, MF_ROWS, 'tff', _ml100k_missing),
    'nwp': Workload(
        'NWP FedRecon (Table 2 task), Shakespeare, vocab 1K + 500 OOV, LSTM 64',
        nwp_setup,
        skip_reason=lambda: _missing(os.path.join(_SHARED_DATA, 'shakespeare'), 'shakespeare.txt.zip'),
    ),
    'furl': Workload(
        'FURL (personalized FL), ASSISTments a0910, configs/furl_assistments.flags',
        furl_setup,
        skip_reason=lambda: _missing(os.path.join(_SHARED_DATA, 'assist-a0910'), 'record.csv', 'item.csv'),
    ),
    'hpfl': Workload(
        'HPFL (both aggregations), ASSISTments a0910, 40 silos, configs/hpfl_assist.flags',
        hpfl_setup,
        skip_reason=lambda: _missing(os.path.join(_SHARED_DATA, 'assist-a0910'), 'record.csv', 'item.csv'),
    ),
    'feddva': Workload(
        'FedDVA (heterogeneous inputs), MNIST, configs/feddva_scaled.flags, 10 of 20 clients per round',
        feddva_setup,
        skip_reason=lambda: _missing(
            os.path.join(_SHARED_DATA, 'mnist'), 'train-images.idx3-ubyte.gz', 'train-labels.idx1-ubyte.gz'
        ),
    ),
}
QUICK_WORKLOADS = ('mf', 'furl')  # --quick: mf and the cheapest other workload (furl ~1 min, nwp ~1.7 min).
