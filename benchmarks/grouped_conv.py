"""Per-client convolution filters: a loop over clients in one TF program against one grouped convolution.

The FedDVA engine trains each client's copy of the encoders, so a group's convolutions have one filter bank per
client, which `tf.vectorized_map` cannot batch. Two ways to run them in one program: `tf.map_fn` over the clients
(the engine's choice), or the clients stacked on the channel axis and one `tf.nn.conv2d` whose filter groups are
the clients' filters. Prints forward + filter-gradient time per call for FedDVA-like layer shapes and checks both
give the same outputs.

    python benchmarks/grouped_conv.py [--clients=10] [--calls=10]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--clients', type=int, default=10)
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--calls', type=int, default=10)
    args = parser.parse_args()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  # After the flags (slow import).

    k, b = args.clients, args.batch

    def loop(x, w):
        return tf.map_fn(lambda a: tf.nn.conv2d(a[0], a[1], 1, 'SAME'), (x, w), fn_output_signature=tf.float32)

    def grouped(x, w):
        _, _, h, _, c = x.shape
        o = w.shape[-1]
        stacked = tf.reshape(tf.transpose(x, [1, 2, 3, 0, 4]), [b, h, h, k * c])
        filters = tf.reshape(tf.transpose(w, [1, 2, 3, 0, 4]), [3, 3, c, k * o])
        y = tf.nn.conv2d(stacked, filters, 1, 'SAME')  # in channels = k * c: k filter groups.
        return tf.transpose(tf.reshape(y, [b, h, h, k, o]), [3, 0, 1, 2, 4])

    for h, c, o in ((28, 1, 32), (14, 32, 64)):
        x = tf.random.stateless_normal([k, b, h, h, c], seed=[0, 1])
        w = tf.random.stateless_normal([k, 3, 3, c, o], seed=[0, 2])
        outputs, times = {}, {}
        for name, conv in (('loop', loop), ('grouped', grouped)):

            @tf.function
            def step(x, w, conv=conv):
                with tf.GradientTape() as tape:
                    tape.watch(w)
                    y = conv(x, w)
                    loss = tf.reduce_sum(y * y)
                return y, tape.gradient(loss, w)

            outputs[name] = step(x, w)
            start = time.perf_counter()
            for _ in range(args.calls):
                step(x, w)
            times[name] = (time.perf_counter() - start) / args.calls * 1000
        diff = float(tf.reduce_max(tf.abs(outputs['loop'][0] - outputs['grouped'][0])))
        print(
            f'{h}x{h}, {c} -> {o} channels, {k} clients x batch {b}: loop {times["loop"]:.1f} ms, '
            f'grouped {times["grouped"]:.1f} ms, max output diff {diff:.1e}'
        )


if __name__ == '__main__':
    main()
