"""One `peer_speed.py` row on pfl-research (Apple's pfl, PyTorch backend): FedAvg rounds on a workload's arrays.

Runs in the virtual environment `peer_speed.py` builds for pfl (never the package's own): it imports neither
TensorFlow nor fedpersonal. Reads the workload file the parent wrote (clients' arrays, initial weights, each
round's sampled clients), runs ``--rounds`` rounds of `pfl.algorithm.FederatedAveraging` on a `SimulatedBackend`
(each round's cohort in the given order, each client one pass over its data in order in batches, plain SGD, the
mean of the clients' model differences weighted by their examples, server SGD), times every round with a
callback and writes the result JSON (``round_seconds``, ``cpu_seconds``, ``peak_rss_mb``: the process'
``ru_maxrss``) and the final weights (in the Keras layout of the workload file).

The ``first_touch`` workload's file holds no arrays: its registry is the clients' ids, each round samples new ones,
and the federated dataset's per-user function makes a sampled user's arrays from its id
(`first_touch_data.client_arrays`) when pfl asks for that user, as a pfl user's data function loads them.
``--threads 0`` leaves PyTorch's default threads.

    <pfl venv>/bin/python benchmarks/peer_pfl_row.py --workload FILE.npz --threads 1 --result OUT.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import first_touch_data  # A sibling module: this file runs as a script, with benchmarks/ on sys.path.
import numpy as np


def keras_to_torch(name: str, value: np.ndarray, flatten_chw: tuple[int, int, int] | None) -> np.ndarray:
    """A Keras weight in PyTorch's layout: dense kernels transposed, conv kernels [out, in, h, w]; the first dense
    kernel after a flatten takes its inputs in (channel, row, column) order instead of Keras' (row, column, channel)."""
    if value.ndim == 4:
        return np.ascontiguousarray(value.transpose(3, 2, 0, 1))
    if value.ndim == 2:
        if flatten_chw is not None and name == 'first_dense_after_flatten':
            c, h, w = flatten_chw
            value = value.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)
        return np.ascontiguousarray(value.T)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--workload', required=True)
    parser.add_argument('--threads', type=int, default=1, help="PyTorch's intra-op threads; 0: its default.")
    parser.add_argument('--result', required=True)
    args = parser.parse_args()
    import torch  # pylint: disable=g-import-not-at-top
    from torch import nn  # pylint: disable=g-import-not-at-top

    if args.threads:
        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(1)
    from pfl.aggregate.simulate import SimulatedBackend  # pylint: disable=g-import-not-at-top
    from pfl.aggregate.weighting import WeightByDatapoints  # pylint: disable=g-import-not-at-top
    from pfl.algorithm import FederatedAveraging  # pylint: disable=g-import-not-at-top
    from pfl.algorithm import NNAlgorithmParams  # pylint: disable=g-import-not-at-top
    from pfl.callback.base import TrainingProcessCallback  # pylint: disable=g-import-not-at-top
    from pfl.data.dataset import Dataset  # pylint: disable=g-import-not-at-top
    from pfl.data.federated_dataset import FederatedDataset  # pylint: disable=g-import-not-at-top
    from pfl.hyperparam import NNTrainHyperParams  # pylint: disable=g-import-not-at-top
    from pfl.model.pytorch import PyTorchModel  # pylint: disable=g-import-not-at-top

    data = np.load(args.workload)
    kind = str(data['kind'])
    schedule = data['schedule']  # [rounds, cohort] client indices.
    if kind == 'first_touch':
        seed = int(data['seed'])
        registered = [str(i) for i in range(int(data['registered']))]  # The registry: ids only.
        check = int(schedule[0, 0])
        assert first_touch_data.fingerprint(check, seed) == float(data['fingerprint']), 'other client data'

        def make_user(user_id: str):
            x, y = first_touch_data.client_arrays(int(user_id), seed)
            return Dataset(raw_data=[torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))], user_id=user_id)

        order = iter([registered[int(c)] for c in schedule.reshape(-1)])
    else:
        offsets = data['offsets']  # Client c's examples: offsets[c]:offsets[c + 1].
        x, y = torch.from_numpy(data['x']), torch.from_numpy(data['y'].astype(np.int64))
        if kind == 'cnn':
            x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW (one channel: the same values).

        def make_user(c: int):
            return Dataset(raw_data=[x[offsets[c] : offsets[c + 1]], y[offsets[c] : offsets[c + 1]]], user_id=c)

        order = iter(schedule.reshape(-1).tolist())
    keras_weights = [data[f'w{i}'] for i in range(int(data['num_weights']))]
    rounds = schedule.shape[0]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            if kind in ('dense', 'first_touch'):
                self.body = nn.Sequential(
                    nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10)
                )
            else:  # PFLlib's FedAvgCNN for 1x28x28 inputs.
                self.body = nn.Sequential(
                    nn.Conv2d(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Flatten(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10),
                )  # fmt: skip
            self.cross_entropy = nn.CrossEntropyLoss()

        def forward(self, inputs):
            return self.body(inputs)

        def loss(self, inputs, labels, eval=False):  # pylint: disable=redefined-builtin
            self.eval() if eval else self.train()
            return self.cross_entropy(self(inputs), labels)

        def metrics(self, inputs, labels, eval=False):  # pylint: disable=redefined-builtin
            from pfl.metrics import Weighted  # pylint: disable=g-import-not-at-top

            self.eval() if eval else self.train()
            return {'loss': Weighted(self.cross_entropy(self(inputs), labels).item() * len(labels), len(labels))}

    net = Net()
    parameters = list(net.parameters())
    flatten_chw = (64, 4, 4) if kind == 'cnn' else None
    dense_seen = 0
    with torch.no_grad():
        for p, w in zip(parameters, keras_weights):
            name = ''
            if w.ndim == 2:
                name = 'first_dense_after_flatten' if dense_seen == 0 else 'dense'
                dense_seen += 1
            p.copy_(torch.from_numpy(keras_to_torch(name, w, flatten_chw)))
    model = PyTorchModel(
        net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=float(data['server_lr'])),
    )
    users = FederatedDataset(make_user, lambda: next(order))
    ends: list[tuple[float, float]] = []

    class Stopwatch(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            ends.append((time.perf_counter(), time.process_time()))
            return False, type(aggregate_metrics)()

    params = NNAlgorithmParams(
        central_num_iterations=rounds,
        evaluation_frequency=10**9,  # Round 0 only (a warm-up round): per-client metrics before and after.
        train_cohort_size=schedule.shape[1],
        val_cohort_size=None,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=1, local_learning_rate=float(data['client_lr']), local_batch_size=int(data['batch'])
    )
    backend = SimulatedBackend(training_data=users, val_data=None, postprocessors=[WeightByDatapoints()])
    start = (time.perf_counter(), time.process_time())
    FederatedAveraging().run(params, backend, model, train_params, callbacks=[Stopwatch()])
    seconds, cpu = (np.diff([start[k]] + [e[k] for e in ends]).tolist() for k in (0, 1))
    trained = [p.detach().numpy() for p in net.parameters()]
    # Back to the Keras layout, for the comparison of final weights.
    back, dense_seen = [], 0
    for t, w in zip(trained, keras_weights):
        if w.ndim == 4:
            back.append(t.transpose(2, 3, 1, 0))
        elif w.ndim == 2:
            if dense_seen == 0 and flatten_chw is not None:
                c, h, wd = flatten_chw
                back.append(t.T.reshape(c, h, wd, -1).transpose(1, 2, 0, 3).reshape(c * h * wd, -1))
            else:
                back.append(t.T)
            dense_seen += 1
        else:
            back.append(t)
    np.savez(args.result + '.npz', *back)
    versions = {'torch': torch.__version__}
    try:
        import importlib.metadata  # pylint: disable=g-import-not-at-top

        versions['pfl'] = importlib.metadata.version('pfl')
    except Exception:  # pylint: disable=broad-except
        pass
    with open(args.result, 'w') as f:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes.
        out = dict(round_seconds=seconds, cpu_seconds=cpu, threads=torch.get_num_threads(), peak_rss_mb=peak)
        json.dump(dict(out, versions=versions), f)


if __name__ == '__main__':
    main()
