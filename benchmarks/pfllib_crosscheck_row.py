"""The PFLlib side of `benchmarks/pfllib_crosscheck.py`: PFLlib's own server and client classes on a workload file.

Runs in the virtual environment the harness builds for PFLlib (never the package's): it imports neither TensorFlow
nor fedpersonal, only PyTorch and PFLlib's ``system/`` modules from ``--pfllib_dir`` (never copied). Reads the
workload the harness wrote (each client's train rows in the order fedpersonal trains them, its test rows, the
initial weights in PyTorch's layout, the algorithm and its arguments), then:

* writes the clients' data as PFLlib's ``dataset/<name>/{train,test}/<id>.npz`` files (its ``save_file`` format)
  in a scratch directory, read back by PFLlib's own ``read_client_data``;
* builds ``args`` from the argparse block of PFLlib's ``system/main.py`` (its defaults, parsed from the file), then
  the workload's values (clients, rounds, device ``cpu``, the method's hyperparameters), and the model as
  ``main.py`` does (``FedAvgCNN``, split into ``BaseHeadSplit(base, head)`` for the methods ``main.py`` splits);
* exact mode (no ``shuffle`` in the workload) patches, in this process only, ``Client.load_train_data`` to the same ``DataLoader(..., drop_last=True)`` with
  ``shuffle=False``: every epoch then reads the rows in the file's order, which is fedpersonal's batch order;
  FedALA's random slice start (``utils/ALA.py``'s ``random.randint``) to fedpersonal's seeded start for that
  client's k-th aggregation (the workload's ``ala_starts``);
* runs the server's own ``train()`` with ``global_rounds = rounds``: after ``rounds`` rounds of training, the
  next round's ``select_clients`` / ``send_models`` snapshot the server's global model and each client's
  predicting model (the attribute the workload names), the server's own evaluation of that round runs (its
  accuracy is the row's), and the clients' next ``train`` stops the run.

Statistical mode (the workload's ``shuffle`` and ``seed``): no patch, PFLlib's own shuffling and FedALA slices, its
torch, ``random`` and numpy seeded after the clients are built; the run stops the same way, after the evaluation of
round ``rounds``. The result's ``curve`` is the accuracy after 0..rounds rounds and ``round_seconds`` each round's
wall time (either mode).

With ``--partition_labels`` (the pooled labels, ``.npy``) and ``--partition`` (``pat`` or ``dir``), it only draws
PFLlib's own partition with its ``dataset/utils/dataset_utils.py`` (`pfllib_partition`) into ``--result`` (npz of
each client's train and test row indices), which the harness compares with fedpersonal's.

Writes ``--result`` (JSON: accuracy, per-client correct and test counts, versions) and ``--result.npz`` (``global_<i>``
and ``client<c>_<i>`` in PyTorch's layout).

    <pfllib venv>/bin/python benchmarks/pfllib_crosscheck_row.py --workload FILE.npz --pfllib_dir DIR --result OUT.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time

import numpy as np


class StopRun(Exception):
    """Raised by the clients' first training call after the compared round's evaluation."""


def main_py_defaults(pfllib_dir: str) -> argparse.Namespace:
    """The ``args`` of PFLlib's ``system/main.py`` with no flags: its argparse block, parsed from the file."""
    with open(os.path.join(pfllib_dir, 'system', 'main.py')) as f:
        source = f.read()
    start = source.index('parser = argparse.ArgumentParser()')
    end = source.index('args = parser.parse_args()')
    scope: dict = {'argparse': argparse}
    block = textwrap.dedent(' ' * (start - source.rindex('\n', 0, start) - 1) + source[start:end])
    exec(compile(block, 'main.py', 'exec'), scope)  # pylint: disable=exec-used
    return scope['parser'].parse_args([])


def pfllib_partition(pfllib_dir: str, labels: np.ndarray, partition: str) -> dict[str, np.ndarray]:
    """PFLlib's own partition of the pooled rows: ``generate_FashionMNIST.py noniid - <partition>``'s seeding
    (``random.seed(1)``, ``np.random.seed(1)``), then its ``separate_data`` and ``split_data``
    (``dataset/utils/dataset_utils.py``) on the pooled labels, with the pooled row indices as the images (they are
    only indexed), so each client's train and test rows come out as indices, in PFLlib's saved order."""
    import random  # pylint: disable=g-import-not-at-top

    sys.path.insert(0, os.path.join(os.path.abspath(pfllib_dir), 'dataset'))
    from utils import dataset_utils  # pylint: disable=g-import-not-at-top

    random.seed(1)
    np.random.seed(1)
    rows = np.arange(labels.size)
    x, y, _ = dataset_utils.separate_data(
        (rows, labels), 20, int(labels.max()) + 1, True, False, partition, class_per_client=2
    )
    train, test = dataset_utils.split_data(x, y)
    out = {f'train_{c}': np.asarray(t['x'], np.int64) for c, t in enumerate(train)}
    out.update({f'test_{c}': np.asarray(t['x'], np.int64) for c, t in enumerate(test)})
    sys.path.pop(0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--workload')
    parser.add_argument('--pfllib_dir', required=True)
    parser.add_argument('--result', required=True)
    parser.add_argument('--partition_labels', help="Only draw PFLlib's partition of these pooled labels (.npy).")
    parser.add_argument('--partition', choices=('pat', 'dir'), help='With --partition_labels.')
    args_in = parser.parse_args()
    if args_in.partition_labels:
        np.savez(
            args_in.result, **pfllib_partition(args_in.pfllib_dir, np.load(args_in.partition_labels), args_in.partition)
        )
        return
    import torch  # pylint: disable=g-import-not-at-top
    from torch import nn  # pylint: disable=g-import-not-at-top
    from torch.utils.data import DataLoader  # pylint: disable=g-import-not-at-top

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    system = os.path.join(os.path.abspath(args_in.pfllib_dir), 'system')
    sys.path.insert(0, system)
    data = np.load(args_in.workload)
    spec = json.loads(str(data['spec']))
    num_clients, rounds = int(spec['num_clients']), int(spec['rounds'])

    scratch = tempfile.mkdtemp(prefix='pfllib_crosscheck_')
    dataset = os.path.join(scratch, 'dataset', 'FashionMNIST_subset')
    for split in ('train', 'test'):
        os.makedirs(os.path.join(dataset, split))
        for c in range(num_clients):
            with open(os.path.join(dataset, split, f'{c}.npz'), 'wb') as f:  # PFLlib's save_file format.
                np.savez_compressed(f, data={'x': data[f'{split}_x_{c}'], 'y': data[f'{split}_y_{c}']})
    run_dir = os.path.join(scratch, 'system')  # PFLlib writes ../results and items/ relative to its cwd.
    os.makedirs(run_dir)
    os.chdir(run_dir)

    from flcore.clients import clientbase  # pylint: disable=g-import-not-at-top
    from flcore.trainmodel.models import BaseHeadSplit  # pylint: disable=g-import-not-at-top
    from flcore.trainmodel.models import FedAvgCNN  # pylint: disable=g-import-not-at-top
    from utils.data_utils import read_client_data  # pylint: disable=g-import-not-at-top

    def load_train_data(self, batch_size=None):  # clientbase.py's, with shuffle=False.
        if batch_size is None:
            batch_size = self.batch_size
        train_data = read_client_data(self.dataset, self.id, is_train=True, few_shot=self.few_shot)
        return DataLoader(train_data, batch_size, drop_last=True, shuffle=False)

    if not spec.get('shuffle'):  # Exact mode; statistical mode keeps PFLlib's own shuffling.
        clientbase.Client.load_train_data = load_train_data

    if spec.get('ala_starts'):  # FedALA: W's random slice starts where fedpersonal's start (its seeded draws).
        from utils import ALA as ala_module  # pylint: disable=g-import-not-at-top

        original_ala = ala_module.ALA.adaptive_local_aggregation
        aggregations: dict = {}

        def adaptive_local_aggregation(self, global_model, local_model):
            skipped = bool(torch.sum(list(global_model.parameters())[0] - list(local_model.parameters())[0]) == 0)
            k = aggregations.get(self.cid, 0)
            start = int(spec['ala_starts'][self.cid][k])
            draws = ala_module.random
            ala_module.random = argparse.Namespace(randint=lambda low, high: start)  # ALA.py:73's draw.
            try:
                original_ala(self, global_model, local_model)
            finally:
                ala_module.random = draws
            if not skipped:  # ALA.py:81: no aggregation while the local model equals the global one.
                aggregations[self.cid] = k + 1

        ala_module.ALA.adaptive_local_aggregation = adaptive_local_aggregation

    args = main_py_defaults(args_in.pfllib_dir)
    args.device = 'cpu'
    args.dataset = dataset  # An absolute path: read_data's os.path.join('../dataset', dataset) is that path.
    args.num_clients, args.global_rounds, args.eval_gap = num_clients, rounds, 1
    for key, value in spec['args'].items():
        setattr(args, key, value)
    torch.manual_seed(0)  # As main.py.
    model = FedAvgCNN(in_features=1, num_classes=args.num_classes, dim=1024)
    with torch.no_grad():
        for p, i in zip(model.parameters(), range(int(spec['num_weights']))):
            p.copy_(torch.from_numpy(data[f'w{i}']))
    if spec['head_split']:  # As main.py for FedAvg, FedPer, FedRep, FedBABU, FedROD, ...
        args.head = copy.deepcopy(model.fc)
        model.fc = nn.Identity()
        model = BaseHeadSplit(model, args.head)
    args.model = model
    module = __import__(f'flcore.servers.{spec["server_module"]}', fromlist=[spec['server_class']])
    server = getattr(module, spec['server_class'])(args, 0)
    if 'seed' in spec:  # Statistical mode: after clientbase.py:18's torch.manual_seed(0) in every client's __init__.
        import random  # pylint: disable=g-import-not-at-top

        torch.manual_seed(int(spec['seed']))
        random.seed(int(spec['seed']))
        np.random.seed(int(spec['seed']))

    calls = {'select': 0}
    snapshot: dict = {}
    last_stats: dict = {}
    by_round: dict = {}  # select call -> (correct, num) of its round's last evaluation: the state after call-1 rounds.
    select_times: list = []

    def params(m):  # A module's parameters, a list of tensors (pFedMe's personalized_params) or one (FedDBE's).
        tensors = m if isinstance(m, list) else [m] if isinstance(m, torch.Tensor) else m.parameters()
        return [p.detach().numpy().copy() for p in tensors]

    def stop(*unused_args, **unused_kwargs):
        raise StopRun()

    original_select, original_send = server.select_clients, server.send_models

    def select_clients():
        calls['select'] += 1
        select_times.append(time.time())
        selected = original_select()
        if calls['select'] == rounds + 1:  # Round `rounds` (0-based): the state after `rounds` rounds.
            snapshot['global'] = params(server.global_model)
            for c in server.clients:  # Before send_models (FedALA's clients: their trained local models).
                snapshot[f'before{c.id}'] = params(c.model)
        return selected

    def send_models():
        original_send()
        if calls['select'] == rounds + 1:
            for c in server.clients:
                snapshot[f'client{c.id}'] = [
                    w for name in spec['client_model'].split(',') for w in params(getattr(c, name))
                ]
                for name in ('train', 'ptrain', 'train_personalized'):
                    if hasattr(c, name):
                        setattr(c, name, stop)

    server.select_clients, server.send_models = select_clients, send_models
    for name in ('test_metrics', 'test_metrics_personalized'):
        if hasattr(server, name):
            original = getattr(server, name)

            def recorded(*a, _original=original, **k):
                out = _original(*a, **k)
                last_stats['ids'], last_stats['num'], last_stats['correct'] = out[0], out[1], out[2]
                by_round[calls['select']] = float(sum(out[2]) / sum(out[1]))
                return out

            setattr(server, name, recorded)
    try:
        server.train()
        raise RuntimeError('the run ended without reaching the compared round')
    except StopRun:
        pass
    arrays = {f'global_{i}': w for i, w in enumerate(snapshot['global'])}
    for c in range(num_clients):
        arrays.update({f'client{c}_{i}': w for i, w in enumerate(snapshot[f'client{c}'])})
        arrays.update({f'before{c}_{i}': w for i, w in enumerate(snapshot[f'before{c}'])})
    if spec.get('save_weights', True):
        np.savez(args_in.result + '.npz', **arrays)
    os.chdir(os.path.dirname(scratch))
    shutil.rmtree(scratch)
    versions = {'torch': torch.__version__}
    with open(args_in.result, 'w') as f:
        json.dump(
            dict(
                # PFLlib's evaluate: correct test predictions over all test rows (pFedMe's evaluate_personalized
                # appends to no list, so the accuracy is taken from the recorded per-client counts).
                accuracy=float(sum(last_stats['correct']) / sum(last_stats['num'])),
                accuracies_by_round=[float(a) for a in server.rs_test_acc],
                client_ids=[int(i) for i in last_stats['ids']],
                client_test=[int(n) for n in last_stats['num']],
                client_correct=[float(n) for n in last_stats['correct']],
                # The accuracy after 0, 1, ..., rounds rounds (the recorded evaluations, pFedMe's too).
                curve=[by_round.get(k + 1) for k in range(rounds + 1)],
                # Wall seconds of each round (training, then the next round's sending and evaluation).
                round_seconds=[b - a for a, b in zip(select_times[:-1], select_times[1:])],
                versions=versions,
            ),
            f,
        )


if __name__ == '__main__':
    main()
