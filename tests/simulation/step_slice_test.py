"""The engine's slices at a loop counter (`lockstep.at`: every client's batch at a step, a client's values) compile
to one XLA program whatever the trace, so the same seed gives the same numbers in one process.

TF 2.14 lowers ``value[:, t]`` at a loop counter ``t`` into XLA as either a plain dynamic slice or a dynamic-size
one (pad and set-dimension-size), differing between traces of the same function in one process (on 2026-12-07, AMD
EPYC: 2 lowerings in 12 traces in each of 4 processes, the odd one at a random trace); the reductions compiled
downstream then round differently (MovieLens FedRecon's reported training loss changed in its last bit between two
same-seed runs, 1 run in 3). A gather has one lowering.
"""

import re

import tensorflow as tf

from fedpersonal.simulation import lockstep

_TRACES = 16


def _lowerings(step_slice) -> set[str]:
    """The distinct unoptimized HLO texts (ids and numbered names stripped) of `_TRACES` fresh traces of a
    loop that sums each client's squared batch at every step, as the lockstep's step slices a group's batches."""
    batch = tf.random.stateless_normal([5, 8, 5], seed=[1, 2])
    steps = tf.constant([8, 2, 3, 8, 1])
    texts = set()
    for _ in range(_TRACES):

        @tf.function(jit_compile=True)
        def run(batch, steps):
            def body(t, total):
                x = step_slice(batch, t)
                return t + 1, total + tf.reduce_sum(x * x, axis=1)

            return tf.while_loop(lambda t, _: t < tf.reduce_max(steps), body, (tf.constant(0), tf.zeros([5])))[1]

        hlo = run.experimental_get_compiler_ir(batch, steps)(stage='hlo')
        texts.add(re.sub(r'[._]\d+', '', hlo))
    return texts


def test_a_step_slice_has_one_lowering_over_traces():
    assert len(_lowerings(lambda batch, t: lockstep.at(batch, t, axis=1))) == 1


def test_a_client_step_slice_has_one_lowering_over_traces():
    assert len(_lowerings(lambda batch, t: lockstep.at(lockstep.at(batch, t % 5), t)[tf.newaxis])) == 1


def test_the_slices_are_strided_slices_values():
    value = tf.reshape(tf.range(2 * 3 * 4), [2, 3, 4])
    for t in range(3):
        assert tf.reduce_all(lockstep.at(value, tf.constant(t), axis=1) == value[:, t])
        assert tf.reduce_all(lockstep.at(lockstep.at(value, tf.constant(1)), tf.constant(t)) == value[1, t])
