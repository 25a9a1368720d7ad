"""Where the HPFL engine's client phase goes: each silo's compiled call, whole and without its training steps.

Runs `simulation_speed.py`'s ``hpfl`` workload (``configs/hpfl_assist.flags``, all 40 ASSIST silos) on the engine
for a few rounds, then times each silo's client-phase program alone (one call at a time, the best of 3): as in
the round, and with zero training and validation steps, which leaves what a silo pays whatever its data: the
k-means of its user and item tables (`fedpersonal.algorithms.hpfl.clustering`) and its uploads. Then one local
step alone (`training.local_training` compiled with XLA, 119 steps of 512 random records on the largest silo's
table sizes: 10,745 items x 110 attributes, 137 users), with TFF's Adam and with SGD, and the dense Adam update of
the item table alone. Writes the per-silo rows and the totals to ``--output``.

    python benchmarks/hpfl_silo_costs.py [--rounds=3] [--output=docs/results/hpfl_silo_costs.json]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import simulation_workloads  # A sibling module (benchmarks/ is on sys.path when this script runs).
from absl import app
from absl import flags

_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Engine rounds before the silos are timed (the first compiles).')
_OUTPUT = flags.DEFINE_string('output', 'docs/results/hpfl_silo_costs.json', 'JSON file written.')


def main(argv) -> None:
    del argv
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  # After the flags (slow import).

    from fedpersonal import program  # pylint: disable=g-import-not-at-top
    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top
    from fedpersonal.simulation import silo_engine  # pylint: disable=g-import-not-at-top

    missing = simulation_workloads.WORKLOADS['hpfl'].skip_reason()
    if missing:
        raise app.UsageError(f'The hpfl workload needs its data: {missing}')
    seen: dict = {}
    run_round = silo_engine.SiloRoundRunner.__call__

    def recording(self, state, silos, private_states, **kwargs):  # Keeps the last round's inputs to time.
        seen.update(runner=self, state=state, silos=silos, private_states=private_states)
        return run_round(self, state, silos, private_states, **kwargs)

    silo_engine.SiloRoundRunner.__call__ = recording
    tensors = lambda structure: tf.nest.map_structure(tf.convert_to_tensor, structure)
    with runtime.LocalRuntime():
        setup = simulation_workloads.hpfl_setup()
        process, _ = setup.build_fedpersonal('engine')
        state = process.initialize()
        private = {c: setup.initial_private_state(c) for c in setup.client_ids}
        for r in range(_ROUNDS.value):
            ids = setup.sample(r)
            output = process.run_round(
                state, [setup.dataset_fn(c) for c in ids], [private[c] for c in ids], client_ids=ids
            )
            state = output.state
            private.update(zip(ids, output.private_states))
        runner, last, functions = seen['runner'], seen['state'], process.parts['functions']
        received, _ = functions.distribute(tensors(last.distributor), tensors(last.global_model_weights))

        def best_of_3(data, silo_state) -> float:
            data, silo_state = tensors(data), tensors(silo_state)
            times = []
            for _ in range(3):
                start = time.perf_counter()
                out = runner._client_phase(received, data, silo_state, None)  # pylint: disable=protected-access
                tf.nest.map_structure(lambda t: t.numpy(), out)
                times.append(time.perf_counter() - start)
            return min(times)

        rows = []
        for data, silo_state in zip(seen['silos'], seen['private_states']):
            cut_data, cut_state = functions.shrink(data, silo_state, silo_engine.rows)
            best_of_3(cut_data, cut_state)  # Warm: a new table size compiles.
            no_steps = cut_data._replace(
                train=cut_data.train._replace(num_steps=np.int32(0)),
                validation=cut_data.validation._replace(num_steps=np.int32(0)),
            )
            rows.append(
                dict(
                    train_steps=int(cut_data.train.num_steps),
                    table_rows=int(np.shape(cut_data.item_attributes)[0]),
                    items=int(cut_state.num_items),
                    seconds=best_of_3(cut_data, cut_state),
                    seconds_without_steps=best_of_3(no_steps, cut_state),
                )
            )
            print(rows[-1], flush=True)
    steps = _step_costs(tf)
    print(steps)
    total = sum(r['seconds'] for r in rows)
    fixed = sum(r['seconds_without_steps'] for r in rows)
    largest = max(rows, key=lambda r: r['table_rows'])
    summary = dict(
        silos=len(rows),
        client_phase_s_sequential=total,
        without_steps_s=fixed,
        without_steps_share=fixed / total,
        largest_silo=largest,
        step_ms=steps,
    )
    print(summary)
    program.write_json(
        _OUTPUT.value,
        dict(command=program.command_line('benchmarks/hpfl_silo_costs.py', sys.argv[1:]), rows=rows, **summary),
    )


def _step_costs(tf) -> dict[str, float]:
    """Milliseconds per local step on the largest silo's table sizes (XLA): Adam, SGD, Adam on the table alone."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedpersonal.algorithms.hpfl import training  # pylint: disable=g-import-not-at-top
    from fedpersonal.core import client_work  # pylint: disable=g-import-not-at-top
    from fedpersonal.models import gum  # pylint: disable=g-import-not-at-top

    items, users, k, batch, steps = 10745, 137, 110, 512, 119
    config = gum.GumConfig(num_attributes=k, max_users=users, max_items=items, hidden_dim=16, task='binary')
    rng = np.random.default_rng(0)
    weights = gum.GumWeights(gum.initial_public(config), gum.initial_private(config))
    attributes = tf.constant((rng.random([items, k]) < 0.03).astype(np.float32))
    batches = dict(
        user=rng.integers(0, users, [steps, batch]).astype(np.int32),
        item=rng.integers(0, items, [steps, batch]).astype(np.int32),
        label=rng.integers(0, 2, [steps, batch]).astype(np.float32),
        mask=np.ones([steps, batch], np.float32),
    )
    data = client_work.PaddedBatches({name: tf.constant(v) for name, v in batches.items()}, tf.constant(steps))

    def per_step(fn, arg, count: int = steps) -> float:
        fn(arg)  # Compiles.
        start = time.perf_counter()
        for _ in range(3):
            tf.nest.map_structure(lambda t: t.numpy(), fn(arg))
        return (time.perf_counter() - start) / 3 / count * 1000

    result = {}
    for name, optimizer in (
        ('adam', tff.learning.optimizers.build_adam(0.03)),
        ('sgd', tff.learning.optimizers.build_sgdm(0.03)),
    ):
        train = tf.function(
            lambda w, optimizer=optimizer: training.local_training(w, data, attributes, optimizer, config)[0],
            jit_compile=True,
        )
        result[f'local_step_{name}'] = per_step(train, weights)
    adam = tff.learning.optimizers.build_adam(0.03)
    table = tf.constant(weights.private.difficulty)
    gradient = tf.scatter_nd(batches['item'][0][:, None], tf.ones([batch, k]), [items, k])

    @tf.function(jit_compile=True)
    def table_steps(value):
        state = adam.initialize(tf.TensorSpec(value.shape, value.dtype))
        for _ in range(10):  # Unrolled (a few steps compile quickly).
            state, value = adam.next(state, value, gradient)
        return value

    result['table_adam_alone'] = per_step(table_steps, table, 10)
    return result


if __name__ == '__main__':
    app.run(main)
