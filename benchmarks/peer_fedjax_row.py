"""One `peer_speed.py` row on FedJAX (Google's fedjax, JAX): FedAvg rounds of the ``first_touch`` workload.

Runs in the virtual environment `peer_speed.py` builds for FedJAX (``--fedjax_venv`` from
``benchmarks/requirements/fedjax-0.0.17.txt``, never the package's): it imports neither TensorFlow nor fedpersonal.
Reads the workload file the parent wrote (registered clients, each round's sampled client ids, initial weights,
hyperparameters) and runs its rounds of `fedjax.algorithms.fed_avg.federated_averaging` on the MLP 784-200-200-10
as a FedJAX user writes it: a haiku model (`fedjax.create_model_from_haiku`, per-example cross-entropy),
`fedjax.model_grad`, `fedjax.optimizers.sgd` on the client and the server, each client one pass over its examples
in order in batches (``ShuffleRepeatBatchHParams(skip_shuffle=True)``); the example-weighted mean of the deltas is
FedAvg's own. The registry is the clients' ids (bytes, as FedJAX's); a sampled client's examples are made from its
id (`first_touch_data.client_arrays`) into a `fedjax.ClientDataset` inside its round, as an in-memory federated
dataset would hand them over. Every round is timed (wall and CPU clock, the server parameters ready) and the result
JSON (``round_seconds``, ``cpu_seconds``, ``peak_rss_mb``: the process' ``ru_maxrss``, ``versions``) and the final
weights (Keras layout: kernel, bias per layer) are written.

``--threads 1`` keeps XLA's CPU computations on one thread (``--xla_cpu_multi_thread_eigen=false``); 0 leaves JAX's
default (Eigen's pool over every core); XLA has no flag for another count.

    <fedjax venv>/bin/python benchmarks/peer_fedjax_row.py --workload FILE.npz --threads 1 --result OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import first_touch_data  # A sibling module: this file runs as a script, with benchmarks/ on sys.path.
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--workload', required=True)
    parser.add_argument('--threads', type=int, default=1, help='1: XLA on one thread; 0: its default.')
    parser.add_argument('--result', required=True)
    args = parser.parse_args()
    if args.threads == 1:  # XLA's CPU matmuls and convolutions on the calling thread (Eigen's pool off).
        os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} --xla_cpu_multi_thread_eigen=false'.strip()
    elif args.threads > 1:
        parser.error('XLA takes no thread count: --threads is 1 (one thread) or 0 (its default).')
    import fedjax  # pylint: disable=g-import-not-at-top
    import haiku as hk  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from fedjax.algorithms import fed_avg  # pylint: disable=g-import-not-at-top

    data = np.load(args.workload)
    assert str(data['kind']) == 'first_touch', 'FedJAX rows run the first_touch workload only.'
    seed, schedule = int(data['seed']), data['schedule']
    registered = [b'%d' % i for i in range(int(data['registered']))]  # The registry: ids only.
    keras_weights = [data[f'w{i}'] for i in range(int(data['num_weights']))]

    def forward_pass(batch):
        return hk.Sequential([hk.Linear(200), jax.nn.relu, hk.Linear(200), jax.nn.relu, hk.Linear(10)])(batch['x'])

    model = fedjax.create_model_from_haiku(
        transformed_forward_pass=hk.transform(forward_pass),
        sample_batch={'x': np.zeros((1, first_touch_data.FEATURES), np.float32), 'y': np.zeros(1, np.int32)},
        train_loss=lambda batch, preds: fedjax.metrics.unreduced_cross_entropy_loss(batch['y'], preds),
        eval_metrics={'accuracy': fedjax.metrics.Accuracy()},
    )
    params = model.init(jax.random.PRNGKey(0))
    names = sorted(params, key=lambda n: (len(n), n))  # linear, linear_1, linear_2: the layers in order.
    params = {
        n: {'w': jnp.asarray(keras_weights[2 * i]), 'b': jnp.asarray(keras_weights[2 * i + 1])}
        for i, n in enumerate(names)
    }
    algorithm = fed_avg.federated_averaging(
        grad_fn=fedjax.model_grad(model),
        client_optimizer=fedjax.optimizers.sgd(float(data['client_lr'])),
        server_optimizer=fedjax.optimizers.sgd(float(data['server_lr'])),
        client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
            batch_size=int(data['batch']), num_epochs=1, skip_shuffle=True
        ),
    )
    state = algorithm.init(params)
    check = int(schedule[0, 0])
    assert first_touch_data.fingerprint(check, seed) == float(data['fingerprint']), 'other client data'

    def sampled(ids, round_rng):
        """The round's clients as (id, ClientDataset, rng), each client's examples made now."""
        out = []
        for c, rng in zip(ids, jax.random.split(round_rng, len(ids))):
            x, y = first_touch_data.client_arrays(int(c), seed)
            out.append((registered[int(c)], fedjax.ClientDataset({'x': x, 'y': y}), rng))
        return out

    seconds, cpu = [], []
    for r, ids in enumerate(schedule):
        t, c = time.perf_counter(), time.process_time()
        state, _ = algorithm.apply(state, sampled(ids, jax.random.PRNGKey(r)))
        jax.block_until_ready(state.params)
        seconds.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        print(f'round {r}: {seconds[-1]:.4f} s', flush=True)
    final = []
    for n in names:
        final += [np.asarray(state.params[n]['w']), np.asarray(state.params[n]['b'])]
    np.savez(args.result + '.npz', *final)
    import importlib.metadata  # pylint: disable=g-import-not-at-top

    versions = {p: importlib.metadata.version(p) for p in ('fedjax', 'jax', 'jaxlib', 'optax', 'dm-haiku', 'numpy')}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(args.result, 'w') as f:
        json.dump(dict(round_seconds=seconds, cpu_seconds=cpu, peak_rss_mb=peak, versions=versions), f)


if __name__ == '__main__':
    main()
