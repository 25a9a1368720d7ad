"""The MF workloads' hand-written limit (`MFLimit`: ../shared/reference/limit_fedrecon_mf.py's one-function round
on the package's split of each client's batches) and their analytic round FLOPs (`mf_round_flops`)."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np


class MFLimit:
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
            from fedpersonal.data import dataset_split

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
            self._round = limit_round_fn(*self.lrs)
        return self._round(weights[0], weights[1], *packed)


def limit_round_fn(lr_u: float, lr_r: float, lr_s: float):
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


def mf_round_flops(arrays: list[tuple[np.ndarray, ...]], dim: int, num_items: int) -> float:
    """Analytic FLOPs of one MF round, 2 per multiply-add, sparse (only the rated items' rows):

    per reconstruction example, prediction 2d + user gradient 2d, and per reconstruction step SGD 2d; per update
    example, prediction 2d + item-row gradient d + SGD on the row 2d; per client and touched row, delta,
    weighting and sum 3d; on the server, mean and SGD over the item matrix, 3 * items * d.
    """
    flops = 3.0 * num_items * dim
    for _, _, s_m, _, _, q_m, uniq in arrays:
        flops += dim * (4 * s_m.sum() + 2 * (s_m.sum(1) > 0).sum() + 5 * q_m.sum() + 3 * (uniq >= 0).sum())
    return float(flops)
