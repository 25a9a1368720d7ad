"""One lockstep client step of an LSTM with per-client weights: unrolled Keras LSTM against the fused `BlockLSTM`.

The engine's client step of the next-word model, LSTM part only: every client of a group has its own LSTM weights,
and `fedpersonal.simulation.lockstep.for_each_client` maps forward + gradient (to the weights and the inputs)
over the clients. Rows: ``unrolled`` (`FunctionalModel(fuse_lstms=False)`: the Keras LSTM unrolled over time,
every op batched by `tf.vectorized_map`) and ``fused`` (the default: `fedpersonal.simulation.fused_lstm`, one
`BlockLSTM` op and its gradient per client, looped by `pfor` inside the vectorized step). Prints the first call
(trace) and the steady time per call, and checks both give the same gradients. Defaults: the NWP round's shapes
(10 clients, batch 16, 20 tokens, embedding 32, LSTM 64).

    python benchmarks/fused_lstm.py [--clients=10] [--calls=30]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--clients', type=int, default=10)
    parser.add_argument('--batch', type=int, default=16)
    parser.add_argument('--length', type=int, default=20)
    parser.add_argument('--inputs', type=int, default=32)
    parser.add_argument('--units', type=int, default=64)
    parser.add_argument('--calls', type=int, default=30)
    args = parser.parse_args()
    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top  # After the flags (slow import).

    with runtime.LocalRuntime():  # Importing TFF starts its default runtime; this one stops its worker on exit.
        _compare(args)


def _compare(args: argparse.Namespace) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from fedpersonal.simulation import functional  # pylint: disable=g-import-not-at-top
    from fedpersonal.simulation import lockstep  # pylint: disable=g-import-not-at-top

    model_fn = lambda: tf.keras.Sequential(
        [tf.keras.Input([args.length, args.inputs]), tf.keras.layers.LSTM(args.units, return_sequences=True)]
    )
    shape = [args.clients, args.batch, args.length]
    x = tf.random.stateless_normal([*shape, args.inputs], seed=[0, 1])
    upstream = tf.random.stateless_normal([*shape, args.units], seed=[0, 2])
    results = {}
    for name, fuse in (('unrolled', False), ('fused', True)):
        model = functional.FunctionalModel(model_fn, fuse_lstms=fuse)
        weights = [
            tf.random.stateless_normal([args.clients, *w.shape], seed=[1, k]) * 0.1
            for k, w in enumerate(model.initial_weights.global_trainable)
        ]

        def client(client_args, model=model):
            client_weights, client_x, client_upstream = client_args
            with tf.GradientTape() as tape:
                tape.watch([client_weights, client_x])
                y, _ = model(functional.Parts(client_weights, [], [], []), client_x)
                loss = tf.reduce_sum(y * client_upstream)
            return tape.gradient(loss, [client_weights, client_x])

        step = tf.function(
            lambda w, model=model, client=client: lockstep.for_each_client(
                client, (w, x, upstream), pfor_loops=model.pfor_loops
            )
        )
        start = time.perf_counter()
        out = step(weights)
        first = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(args.calls):
            out = step(weights)
        tf.nest.map_structure(lambda t: t.numpy(), out)
        results[name] = (first, (time.perf_counter() - start) / args.calls * 1000, out)
    diff = max(
        float(tf.reduce_max(tf.abs(a - b)))
        for a, b in zip(tf.nest.flatten(results['unrolled'][2]), tf.nest.flatten(results['fused'][2]))
    )
    for name, (first, ms, _) in results.items():
        print(f'{name}: first call (trace) {first:.1f} s, {ms:.1f} ms per call')
    print(
        f'{args.clients} clients x batch {args.batch} x {args.length} steps, {args.inputs} -> {args.units}: fused is '
        f'{results["unrolled"][1] / results["fused"][1]:.2f}x the unrolled step; max gradient diff {diff:.1e}'
    )


if __name__ == '__main__':
    main()
