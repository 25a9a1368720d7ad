"""Seconds per simulated round (FedRecon, FURL), side by side on identical work, in one run (issue 14).

  python benchmarks/simulation_speed.py [--quick] [--rounds 10] [--workloads mf,mf_table1,nwp,furl]
      [--rows tff,per_client,engine,limit] [--data_dir DIR_WITH_ML100K_u.data] [--output FILE]

Rows: ``tff`` (TFF 0.87's own ``tff.learning.algorithms.build_fed_recon``, same model, split and optimizers),
``per_client`` and ``engine`` (``fedpersonal.algorithms.build_fed_recon`` / ``build_furl(..., simulation=...)``;
per_client leaves the argument out if the builder does not take it: ``simulation_arg``), ``limit`` (one hand-written XLA-compiled
function per round: ``../shared/reference/limit_fedrecon_mf.py`` on the same data, split batches, initial weights).

Each row runs in its own process from the same initial weights: 1 warm-up round, then ``--rounds`` timed rounds
on the same seeded client samples. ``seconds_per_round``: median timed round, ``process.run_round(state,
datasets[, private states], client_ids=ids)`` (fedpersonal: packs, then its fastest round) or ``next`` (TFF);
building the clients' lazy tf.data pipelines is not timed, and the engine rows materialize every sampled client's
data once before round 0 (``prepare_s``, as the limit prepares its arrays). ``compile_s``: build + initialize +
warm-up round - ``seconds_per_round`` (without the one-off ``prepare_s``). ``peak_rss_mb``: the row process' ``ru_maxrss`` +
its TFF ``worker_binary``'s VmHWM (TFF computations run there), also given apart. ``max_abs_diff_vs_per_client``:
final server weights vs the per-client row's (``max_abs_weight``: the row's largest weight, for scale).
``compute_bound_s``: the round's analytic FLOPs (``_mf_round_flops``, ``_nwp_round_flops``,
``_furl_round_flops``; only the real examples, matmuls at 2 FLOPs per multiply-add) / a float32 matmul's measured
FLOP rate. A stateful process (FURL) carries each client's private state between rounds (a dict by client id,
starting from ``process.initial_private_state()``) into ``process.run_round``; its timed round includes them.

Workloads (``WORKLOADS``; a new one is a ``*_setup()`` returning a ``Setup`` plus a registry entry):
``mf``: generated MovieLens-shaped MF as in the reference (1,000 users, 3,700 items, 100 ratings each, dim 50),
100 clients per round, batch 5, ``ReconstructionSplit(0.5, strategy='order', recon_epochs=5)``: 50
reconstruction + 10 update SGD steps, client and reconstruction lr 0.1, server 1.0. ``mf_table1``: the Table 1
FedRecon round (``fedpersonal.tasks.movielens_mf`` defaults) on MovieLens 100K from ``--data_dir``; without the
data it is skipped with the reason printed and recorded (never replaced by generated data).
``nwp``: FedRecon of the next-word-prediction task (``fedpersonal.tasks.next_word_prediction``) on its Shakespeare
configuration: ``NextWordPredictionConfig`` defaults with ``dataset='shakespeare'`` (first vocabulary size, 1,000
words + 500 local OOV buckets, LSTM 64, embedding 32, 20 tokens, batch 16, <= 128 sequences per client, 10 clients
per round, Yogi server) on the training roles of ``../shared/data/shakespeare``, built by the task's own
``build_fed_recon`` (so with the Table 2 binary's communication measurement: the measured broadcast and aggregator
per client, ``measure_communication`` on the engine). ``furl``: FURL (``fedpersonal.algorithms.build_furl``, as
``fedpersonal.tasks.furl_personalization.run_personalized_fl`` builds it) on ``configs/furl_assistments.flags``
with ``../shared/data/assist-a0910`` (10 students per round, one local epoch, user embedding 8). Both have rows
``per_client`` and ``engine`` only; without their data they are skipped with the reason (never generated data).

``--quick`` (2 timed rounds of ``QUICK_WORKLOADS``: ``mf`` and the cheapest other workload, ``furl``, unless
``--workloads``; ``mf_table1`` and ``nwp`` are left out to stay under 5 minutes) takes ~4 minutes on 2 cores.
Writes ``--output`` (``command``, ``machine``, ``flop_rate_gflops``, ``rows``, ``skipped``) and prints a Markdown
table.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import app
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUTPUT = flags.DEFINE_string('output', 'docs/results/simulation_speed.json', 'JSON file written.')
_QUICK = flags.DEFINE_bool('quick', False, 'Quick run: 2 timed rounds, workloads mf and furl (unless --workloads).')
_SHARED_DATA = os.path.normpath(os.path.join(_REPO, '..', 'shared', 'data'))  # The project's data copies.
_ROUNDS = flags.DEFINE_integer('rounds', None, 'Timed rounds per row, after 1 warm-up round (default 10; quick 2).')
_WORKLOADS = flags.DEFINE_list('workloads', None, 'Workloads to run (default: all; quick: mf, furl).')
_ROWS = flags.DEFINE_list('rows', None, 'Rows to run (default: every row of each workload).')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'Directory holding MovieLens 100K u.data (for mf_table1).')
_ROW_TIMEOUT = flags.DEFINE_integer('row_timeout', 1800, 'Seconds before a row process is stopped.')
_ROW = flags.DEFINE_string('_row', None, 'Internal: run this row in this process.')
_WORKLOAD = flags.DEFINE_string('_workload', None, 'Internal: workload of --_row.')
_RESULT = flags.DEFINE_string('_result', None, 'Internal: JSON file --_row writes (weights next to it, .npz).')

ROW_DESCRIPTIONS = {
    'tff': 'TFF 0.87 tff.learning.algorithms.build_fed_recon',
    'per_client': "fedpersonal build_fed_recon / build_furl(simulation='per_client')",
    'engine': "fedpersonal build_fed_recon / build_furl(simulation='engine')",
    'limit': 'hand-written single XLA-compiled round function',
}


# ------------------------------------------------------------------------------------------------ workloads
@dataclasses.dataclass
class Setup:
    """What the rows of one workload need (built in the row process: it imports TensorFlow)."""

    client_ids: list[str]
    dataset_fn: Callable[[str], Any]  # client id -> batched tf.data.Dataset
    clients_per_round: int
    build_fedpersonal: Callable[[str], tuple[Any, dict]]  # simulation -> (PersonalizedProcess, info)
    build_tff: Callable[[], Any] | None = None  # -> tff.learning.templates.LearningProcess
    build_limit: Callable[[], Any] | None = None  # -> an object like _MFLimit
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


def _mf_setup(client_ids, dataset_fn, model_fn, split, lrs, batch, max_examples, num_items, dim, cpr) -> Setup:
    """A FedRecon MF `Setup` (all four rows); lrs = (client, reconstruction, server) SGD learning rates.

    No metrics beyond the loss and example count in any row (`metrics_fn=None`): the same work everywhere."""
    import tensorflow as tf
    import tensorflow_federated as tff

    from fedpersonal import algorithms

    sgd = [tff.learning.optimizers.build_sgdm(lr) for lr in lrs]
    mse = tf.keras.losses.MeanSquaredError

    def build_fedpersonal(simulation: str) -> tuple[Any, dict]:
        kwargs = dict(zip(('client_optimizer', 'reconstruction_optimizer', 'server_optimizer'), sgd))
        kwargs.update(loss_fn=mse, metrics_fn=None, dataset_split=split)
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

    limit = _MFLimit(dataset_fn, model_fn, split, lrs, batch, max_examples)
    flops = lambda ids: _mf_round_flops([limit.client_arrays(c) for c in ids], dim, num_items)
    return Setup(client_ids, dataset_fn, cpr, build_fedpersonal, build_tff, lambda: limit, flops)


def mf_setup() -> Setup:
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
    return _mf_setup(list(data), dataset_fn, model_fn, split, (0.1, 0.1, 1.0), batch, per_user, num_items, dim, 100)


def _ml100k_missing() -> str | None:
    if not _DATA_DIR.value:
        return 'no --data_dir (`bash ../shared/data/fetch-movielens-100k /tmp/ml-100k`, then --data_dir=/tmp/ml-100k)'
    if not os.path.isfile(os.path.join(_DATA_DIR.value, 'u.data')):
        return f'no MovieLens 100K u.data in --data_dir={_DATA_DIR.value}'
    return None


def mf_table1_setup() -> Setup:
    """The FedRecon row of Table 1 (`MovieLensMFConfig` defaults) on MovieLens 100K's training users."""
    from fedpersonal.tasks import movielens_mf

    config = movielens_mf.MovieLensMFConfig(data_dir=_DATA_DIR.value, variant='100k')
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

    from fedpersonal.algorithms import dataset_split
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


def _assist_config(config_cls, flagfile: str):
    """A task config from `configs/<flagfile>` with the shared ASSISTments copy as its data."""
    from absl import flags as absl_flags

    from fedpersonal.program import config_flags

    values = absl_flags.FlagValues()
    config_flags.define_flags(config_cls, flag_values=values)
    values(
        [
            'benchmark',
            f'--flagfile={os.path.join(_REPO, "configs", flagfile)}',
            f'--data_dir={os.path.join(_SHARED_DATA, "assist-a0910")}',
            f'--output_dir={tempfile.gettempdir()}',
        ]
    )
    return config_flags.config_from_flags(config_cls, flag_values=values)


def _furl_config():
    """`FurlConfig` from configs/furl_assistments.flags with the shared ASSISTments copy."""
    from fedpersonal.tasks import furl_personalization

    return _assist_config(furl_personalization.FurlConfig, 'furl_assistments.flags')


def furl_setup() -> Setup:
    """FURL (personalized FL row of the FURL task) on its ASSISTments configuration."""
    from fedpersonal.algorithms import furl
    from fedpersonal.algorithms import optimizers
    from fedpersonal.tasks import furl_personalization

    config = _furl_config()
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
            group_size=config.group_size,
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


WORKLOADS: dict[str, Workload] = {
    'mf': Workload('generated MovieLens-shaped MF, dim 50', mf_setup, tuple(ROW_DESCRIPTIONS), 'tff'),
    'mf_table1': Workload('Table 1 round, ML-100K', mf_table1_setup, tuple(ROW_DESCRIPTIONS), 'tff', _ml100k_missing),
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
    # feddva: a `*_setup()` whose Setup has build_fedpersonal only (rows per_client, engine).
}
QUICK_WORKLOADS = ('mf', 'furl')  # --quick: mf and the cheapest other workload (furl ~1 min, nwp ~1.7 min).


# ------------------------------------------------------------------------------------- the limit (MF only)
class _MFLimit:
    """The reference's one-function round on the batches of the package's split (`split_examples`, then batched,
    repeated and capped as `build_dataset_split_fn` does), padded with masks (partial batches, smaller clients) to
    the step counts of the largest client."""

    def __init__(self, dataset_fn, model_fn, split, lrs, batch, max_examples):
        self.dataset_fn, self.model_fn, self.lrs, self.batch, self.split = dataset_fn, model_fn, lrs, batch, split
        n_support = max(1, min(max_examples - 1, round(max_examples * split.support_fraction)))
        n_query = max_examples if split.allow_overlap else max_examples - n_support
        n_support = max_examples if split.allow_overlap else n_support
        steps = lambda n, epochs, cap: min(-(-n // batch) * epochs, cap if cap is not None else 1 << 30)
        self.steps = (
            steps(n_support, split.recon_epochs, split.recon_steps_max),
            steps(n_query, split.post_recon_epochs, split.post_recon_steps_max),
        )
        self._cache: dict[str, tuple[np.ndarray, ...]] = {}
        self._round = None

    def initial_weights(self) -> tuple[np.ndarray, np.ndarray]:
        """The item matrix and the user embedding every client starts reconstruction from (seeded initializer)."""
        model = self.model_fn()
        (items,), (user,) = model.global_trainable_variables, model.local_trainable_variables
        assert not model.global_non_trainable_variables, 'the limit handles the bias-free MF model only'
        return items.numpy(), user.numpy().reshape(-1)

    def client_arrays(self, cid: str) -> tuple[np.ndarray, ...]:
        """(support items, ratings, mask: [R, B]; query slots, ratings, mask: [Q, B]; query's unique items [Q*B])."""
        if cid not in self._cache:
            from fedpersonal.algorithms import dataset_split

            batches = list(self.dataset_fn(cid).as_numpy_iterator())
            examples = collections.OrderedDict((k, np.concatenate([b[k] for b in batches])) for k in batches[0])
            s, out = self.split, []
            support, query = dataset_split.split_examples(examples, s)  # The package's split of the examples.
            for part, epochs, cap, steps in (
                (support, s.recon_epochs, s.recon_steps_max, self.steps[0]),
                (query, s.post_recon_epochs, s.post_recon_steps_max, self.steps[1]),
            ):
                x, y = part['x'].numpy()[:, 0], part['y'].numpy()[:, 0]
                items, ratings = np.full([steps, self.batch], -1, np.int64), np.zeros([steps, self.batch], np.float32)
                starts = list(range(0, len(x), self.batch)) * epochs  # As `_iterate`: batch, repeat, take.
                for t, i in enumerate(starts[:cap] if cap is not None else starts):
                    n = min(self.batch, len(x) - i)
                    items[t, :n], ratings[t, :n] = x[i : i + n], y[i : i + n]
                mask = (items >= 0).astype(np.float32)
                out += [np.maximum(items, 0), ratings, mask]
            uniq, slots = np.unique(out[3][out[5] > 0], return_inverse=True)
            out[3][out[5] > 0] = slots
            out.append(np.pad(uniq, (0, self.steps[1] * self.batch - len(uniq)), constant_values=-1))
            self._cache[cid] = tuple(out)
        return self._cache[cid]

    def pack(self, ids: list[str]) -> list[Any]:
        import tensorflow as tf

        return [tf.constant(np.stack(a)) for a in zip(*[self.client_arrays(c) for c in ids])]

    def round(self, weights: Any, packed: list[Any]) -> Any:
        if self._round is None:
            self._round = _limit_round_fn(*self.lrs)
        return self._round(weights[0], weights[1], *packed)


def _limit_round_fn(lr_u: float, lr_r: float, lr_s: float):
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def round_fn(G, u0, s_i, s_r, s_m, q_slot, q_r, q_m, uniq):
        u = tf.tile(u0[None], [s_i.shape[0], 1])
        for t in range(s_i.shape[1]):  # Reconstruction: SGD on the user embedding, items frozen (MSE: 2/n).
            iv = tf.gather(G, s_i[:, t])
            n = tf.maximum(tf.reduce_sum(s_m[:, t], 1), 1.0)
            err = (tf.einsum('cd,cbd->cb', u, iv) - s_r[:, t]) * s_m[:, t]
            u = u - lr_r * (2.0 / n)[:, None] * tf.einsum('cb,cbd->cd', err, iv)
        m = uniq.shape[1]
        rows0 = tf.gather(G, tf.maximum(uniq, 0))
        rows = rows0
        for t in range(q_slot.shape[1]):  # Update: SGD on the client's copy of its item rows, user frozen.
            oh = tf.one_hot(q_slot[:, t], m) * q_m[:, t, :, None]
            iv = tf.einsum('cbm,cmd->cbd', oh, rows)
            n = tf.maximum(tf.reduce_sum(q_m[:, t], 1), 1.0)
            err = (tf.einsum('cd,cbd->cb', u, iv) - q_r[:, t]) * q_m[:, t]
            grad = (2.0 / n)[:, None, None] * err[..., None] * u[:, None, :]
            rows = rows - lr_u * tf.einsum('cbm,cbd->cmd', oh, grad)
        w = tf.reduce_sum(q_m, [1, 2])  # NUM_EXAMPLES weighting: the query examples processed.
        delta = (rows0 - rows) * tf.cast(uniq >= 0, G.dtype)[..., None] * w[:, None, None]
        index = tf.reshape(tf.maximum(uniq, 0), [-1, 1])
        agg = tf.tensor_scatter_nd_add(tf.zeros_like(G), index, tf.reshape(delta, [-1, G.shape[1]]))
        return G - lr_s * agg / tf.reduce_sum(w)

    return round_fn


def _mf_round_flops(arrays: list[tuple[np.ndarray, ...]], dim: int, num_items: int) -> float:
    """Analytic FLOPs of one MF round, 2 per multiply-add, sparse (only the rated items' rows):

    per reconstruction example, prediction 2d + user gradient 2d, and per reconstruction step SGD 2d; per update
    example, prediction 2d + item-row gradient d + SGD on the row 2d; per client and touched row, delta,
    weighting and sum 3d; on the server, mean and SGD over the item matrix, 3 * items * d.
    """
    flops = 3.0 * num_items * dim
    for _, _, s_m, _, _, q_m, uniq in arrays:
        flops += dim * (4 * s_m.sum() + 2 * (s_m.sum(1) > 0).sum() + 5 * q_m.sum() + 3 * (uniq >= 0).sum())
    return float(flops)


# ------------------------------------------------------------------------------------------ row processes
def _worker_peak_mb() -> float:
    from fedpersonal import runtime

    total = 0.0
    for pid in set(runtime.running_workers()) | set(runtime.worker_pids_of_this_process()):
        try:
            with open(f'/proc/{pid}/status') as f:
                total += next(int(line.split()[1]) for line in f if line.startswith('VmHWM:')) / 1024
        except (OSError, StopIteration):
            pass
    return total


def _run_rounds(setup: Setup, rounds: int, start: Callable[[], Any], step: Callable[[Any, list[str]], Any]):
    """start() -> state; then 1 warm-up + `rounds` timed rounds of step(state, ids) -> (state, seconds, pack s)."""
    t0 = time.perf_counter()
    state = start()
    info: dict[str, Any] = dict(build_s=time.perf_counter() - t0, round_seconds=[], pack_seconds=[])
    for r in range(rounds + 1):
        state, seconds, pack_s = step(state, setup.sample(r))
        if r == 0:
            info['first_round_s'] = seconds
        else:
            info['round_seconds'].append(seconds)
            info['pack_seconds'].append(pack_s)
        print(f'round {r}: {seconds:.4f} s (pack {pack_s:.4f} s)', flush=True)
    info['pack_s'] = float(np.median(info.pop('pack_seconds')))
    return state, info


def _row_process(setup: Setup, rounds: int, build: Callable[[], tuple[Any, dict]]):
    """A TFF-runtime row: build() -> (process, info). Times `run_round` (fedpersonal) or `next` (TFF).

    A stateful process's private states are kept by client id between rounds (`initial_private_state()` before a
    client's first round) and go into `run_round` with the round's datasets.
    """
    from fedpersonal import runtime

    with runtime.LocalRuntime():
        holder: dict[str, Any] = {}
        private: dict[str, Any] = {}

        def start():
            holder['process'], holder['info'] = build()
            process = holder['process']
            if getattr(process, 'simulation', 'per_client') == 'engine':
                # Each sampled client's data is materialized once per run (as the limit row prepares its arrays):
                # timed apart as prepare_s, not per round.
                t = time.perf_counter()
                clients = sorted({c for r in range(rounds + 1) for c in setup.sample(r)})
                process.pack([setup.dataset_fn(c) for c in clients], client_ids=clients)
                holder['info']['prepare_s'] = time.perf_counter() - t
            return process.initialize()

        def step(state, ids):
            datasets = [setup.dataset_fn(c) for c in ids]  # Lazy tf.data pipelines, built outside the timer.
            process = holder['process']
            run_round = getattr(process, 'run_round', None)  # fedpersonal: packs, then its fastest round.
            if run_round is None:  # TFF's own LearningProcess.
                t = time.perf_counter()
                state = process.next(state, datasets).state
                return state, time.perf_counter() - t, 0.0
            if not process.stateful:
                t = time.perf_counter()
                state = run_round(state, datasets, client_ids=ids).state
                return state, time.perf_counter() - t, 0.0
            if 'initial' not in holder:
                holder['initial'] = process.initial_private_state()
            first = setup.initial_private_state or (lambda c: holder['initial'])
            states = [private[c] if c in private else first(c) for c in ids]
            t = time.perf_counter()
            output = run_round(state, datasets, states, client_ids=ids)
            seconds = time.perf_counter() - t
            private.update(zip(ids, output.private_states))
            return output.state, seconds, 0.0

        state, info = _run_rounds(setup, rounds, start, step)
        info.update(holder['info'], has_pack=hasattr(holder['process'], 'pack'), peak_rss_mb_worker=_worker_peak_mb())
        return holder['process'].get_model_weights(state), info


def _row_limit(setup: Setup, rounds: int):
    import tensorflow as tf

    limit, prepare_s = setup.build_limit(), []

    def start():  # Each sampled client's split and step arrays, prepared once before round 0 (prepare_s).
        t = time.perf_counter()
        for c in {c for r in range(rounds + 1) for c in setup.sample(r)}:
            limit.client_arrays(c)
        prepare_s.append(time.perf_counter() - t)
        return tuple(tf.constant(w) for w in limit.initial_weights())

    def step(weights, ids):
        t = time.perf_counter()
        packed = limit.pack(ids)
        pack_s = time.perf_counter() - t
        items = limit.round(weights, packed).numpy()
        return (tf.constant(items), weights[1]), time.perf_counter() - t, pack_s

    weights, info = _run_rounds(setup, rounds, start, step)
    info.update(peak_rss_mb_worker=0.0, prepare_s=prepare_s[0])
    return [weights[0].numpy()], info


ROW_RUNNERS = {
    'tff': lambda setup, rounds: _row_process(setup, rounds, lambda: (setup.build_tff(), {})),
    'per_client': lambda setup, rounds: _row_process(setup, rounds, lambda: setup.build_fedpersonal('per_client')),
    'engine': lambda setup, rounds: _row_process(setup, rounds, lambda: setup.build_fedpersonal('engine')),
    'limit': _row_limit,
}


def run_row(row: str, workload: str, rounds: int, result_path: str) -> None:
    """The row process: runs one row, writes its result JSON and its final server weights (.npz)."""
    result: dict[str, Any] = {'name': row, 'workload': workload}
    try:
        import tensorflow as tf

        setup = WORKLOADS[workload].setup()
        weights, info = ROW_RUNNERS[row](setup, rounds)
        flat = tf.nest.flatten(getattr(weights, 'trainable', weights))
        np.savez(result_path + '.npz', *[np.asarray(w) for w in flat])
        spr = float(np.median(info['round_seconds']))
        python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux.
        result.update(info, seconds_per_round=spr, rounds=rounds, clients_per_round=setup.clients_per_round)
        result.update(
            compile_s=max(0.0, info['build_s'] - info.get('prepare_s', 0.0) + info['first_round_s'] - spr),
            peak_rss_mb=python_mb + info['peak_rss_mb_worker'],
            peak_rss_mb_python=python_mb,
            weights=result_path + '.npz',
        )
        if setup.round_flops is not None:
            result['round_flops'] = float(np.mean([setup.round_flops(setup.sample(r)) for r in range(1, rounds + 1)]))
    except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()
        result['error'] = f'{type(e).__name__}: {e}'.strip()[:2000]
    with open(result_path, 'w') as f:
        json.dump(result, f, indent=1)


# ---------------------------------------------------------------------------------------------- the parent
def measure_flop_rate() -> float:
    """GFLOP/s of a 2048^2 float32 matmul (best of 5, TensorFlow's default threads)."""
    import tensorflow as tf

    n = 2048
    a, b = tf.random.uniform([n, n]), tf.random.uniform([n, n])
    tf.matmul(a, b).numpy()
    times = []
    for _ in range(5):
        times.append(time.perf_counter())
        tf.matmul(a, b).numpy()
        times[-1] = time.perf_counter() - times[-1]
    return 2.0 * n**3 / min(times) / 1e9


def _spawn(row: str, workload: str, rounds: int, work_dir: str) -> dict[str, Any]:
    result, log = (os.path.join(work_dir, f'{workload}.{row}.{ext}') for ext in ('json', 'log'))
    cmd = [sys.executable, os.path.abspath(__file__), f'--_row={row}', f'--_workload={workload}', f'--_result={result}']
    cmd += [f'--rounds={rounds}'] + ([f'--data_dir={_DATA_DIR.value}'] if _DATA_DIR.value else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get('TF_CPP_MIN_LOG_LEVEL', '2'))
    started = time.time()
    with open(log, 'w') as out:  # A file, never a pipe: TFF's worker keeps inherited descriptors open.
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=out, cwd=_REPO, env=env, timeout=_ROW_TIMEOUT.value).returncode
        except subprocess.TimeoutExpired:
            rc = 'timeout'
    if os.path.exists(result):
        with open(result) as f:
            out_row = json.load(f)
    else:
        with open(log, errors='replace') as f:
            tail = f.read()[-1500:]
        out_row = {'name': row, 'workload': workload, 'error': f'row process exited with {rc}; log tail: {tail}'}
    out_row.update(description=ROW_DESCRIPTIONS[row], wall_s=time.time() - started)
    return out_row


def _load(path: str) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f'arr_{i}'] for i in range(len(z.files))]


def finish_workload(rows: list[dict[str, Any]], workload: Workload, gflops: float) -> None:
    """Adds speedups, weight differences and the compute bound to one workload's rows (in place)."""
    ok = {r['name']: r for r in rows if 'error' not in r}
    base = ok.get(workload.baseline)
    reference = _load(ok['per_client']['weights']) if 'per_client' in ok else None
    flops = next((r['round_flops'] for r in ok.values() if 'round_flops' in r), None)
    for r in ok.values():
        r[f'speedup_vs_{workload.baseline}'] = base['seconds_per_round'] / r['seconds_per_round'] if base else None
        own = _load(r.pop('weights'))
        r['max_abs_weight'] = max(float(np.max(np.abs(w))) for w in own)
        same = reference is not None and [w.shape for w in own] == [w.shape for w in reference]
        diffs = [float(np.max(np.abs(a - b.astype(np.float64)))) for a, b in zip(own, reference or [])]
        r['max_abs_diff_vs_per_client'] = max(diffs) if same else reference and 'weight shapes differ'
        r['compute_bound_s'] = flops / (gflops * 1e9) if flops is not None else None


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else ('-' if value is None else str(value))


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        '| workload | row | s/round | speedup | compile s | pack s | peak RSS MB | max diff vs per-client | bound s |',
        '|---|---|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        if 'error' in r:
            lines.append(f'| {r["workload"]} | {r["name"]} | error: {r["error"].splitlines()[0][:120]} |||||||')
            continue
        speedup = r.get('speedup_vs_tff', r.get('speedup_vs_per_client'))
        lines.append(
            f'| {r["workload"]} | {r["name"]} | {_fmt(r["seconds_per_round"], ".4f")} | {_fmt(speedup, ".1f")}{"x" if speedup else ""} | '
            f'{_fmt(r["compile_s"], ".1f")} | {_fmt(r["pack_s"], ".4f")} | {_fmt(r["peak_rss_mb"], ".0f")} | '
            f'{_fmt(r["max_abs_diff_vs_per_client"], ".2e")} | {_fmt(r["compute_bound_s"], ".2e")} |'
        )
    return '\n'.join(lines)


def _machine() -> dict[str, Any]:
    with open('/proc/cpuinfo') as f:
        model = next((line.split(':', 1)[1].strip() for line in f if line.startswith('model name')), '')
    versions = {p: importlib.metadata.version(p) for p in ('tensorflow', 'tensorflow-federated', 'numpy')}
    git = lambda *a: subprocess.run(['git', *a], cwd=_REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(git('status', '--porcelain', '--untracked-files=no'))  # Uncommitted changes were measured too.
    return dict(
        cpus=os.cpu_count(),
        cpu_model=model,
        platform=platform.platform(),
        commit=git('rev-parse', 'HEAD'),
        commit_dirty=dirty,
        **versions,
    )


def main() -> None:
    rounds = _ROUNDS.value or (2 if _QUICK.value else 10)
    if _ROW.value:
        return run_row(_ROW.value, _WORKLOAD.value, rounds, _RESULT.value)
    names = _WORKLOADS.value or (list(QUICK_WORKLOADS) if _QUICK.value else list(WORKLOADS))
    unknown = [w for w in names if w not in WORKLOADS] + [r for r in _ROWS.value or [] if r not in ROW_RUNNERS]
    if unknown:
        sys.exit(f'unknown workloads/rows {unknown}; workloads: {list(WORKLOADS)}, rows: {list(ROW_RUNNERS)}')
    started = time.time()
    gflops = measure_flop_rate()
    print(f'float32 matmul: {gflops:.1f} GFLOP/s', flush=True)
    rows, skipped = [], []
    with tempfile.TemporaryDirectory(prefix='simulation_speed_') as work_dir:
        for name in names:
            workload = WORKLOADS[name]
            reason = workload.skip_reason()
            if reason:
                print(f'[{name}] skipped: {reason}', flush=True)
                skipped.append({'workload': name, 'reason': reason})
                continue
            workload_rows = []
            for row in [r for r in workload.rows if not _ROWS.value or r in _ROWS.value]:
                print(f'[{name}] {row} ...', flush=True)
                result = _spawn(row, name, rounds, work_dir)
                outcome = result['error'] if 'error' in result else f'{result["seconds_per_round"]:.4f} s'
                print(f'[{name}] {row}: {outcome}', flush=True)
                workload_rows.append(result)
            finish_workload(workload_rows, workload, gflops)
            rows += workload_rows
    command = 'python ' + ' '.join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], _REPO)] + sys.argv[1:])
    report = dict(command=command, machine=_machine(), flop_rate_gflops=gflops, rounds=rounds, rows=rows)
    report.update(skipped=skipped, workloads={n: WORKLOADS[n].description for n in names}, wall_s=time.time() - started)
    output = os.path.join(_REPO, _OUTPUT.value)  # Relative to the repository; an absolute path stays as is.
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, 'w') as f:
        json.dump(report, f, indent=1)
        f.write('\n')
    print(markdown(rows))
    print(f'wrote {output} in {report["wall_s"]:.0f} s')


if __name__ == '__main__':
    # Flags first (importing TFF takes ~10 s), and no app.run: with TensorFlow first imported inside app.run, TF
    # 2.14's Keras built the MF model's functional graph eagerly here (its Flatten layer failed on the None batch).
    app.define_help_flags()
    app.parse_flags_with_usage(sys.argv)
    main()
