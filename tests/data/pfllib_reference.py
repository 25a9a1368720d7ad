"""PFLlib's partition code, transcribed as the tests' reference (not a test module).

``separate_data`` ('pat' and 'dir') and ``split_data`` as in TsingZ0/PFLlib ``dataset/utils/dataset_utils.py`` (commit
d832e76), printing and file writing removed. They draw from numpy's global state, as PFLlib does; `run_pfllib`
seeds it and restores it afterwards.
"""

import numpy as np
from sklearn import model_selection


def pfllib_separate_data(dataset_label, num_clients, num_classes, balance, partition_name, class_per_client, alpha,
                         least_samples):  # fmt: skip
    dataidx_map = {}
    if partition_name == 'pat':
        idxs = np.array(range(len(dataset_label)))
        idx_for_each_class = []
        for i in range(num_classes):
            idx_for_each_class.append(idxs[dataset_label == i])
        class_num_per_client = [class_per_client for _ in range(num_clients)]
        for i in range(num_classes):
            selected_clients = []
            for client in range(num_clients):
                if class_num_per_client[client] > 0:
                    selected_clients.append(client)
            if len(selected_clients) == 0:
                break
            selected_clients = selected_clients[: int(np.ceil((num_clients / num_classes) * class_per_client))]
            num_all_samples = len(idx_for_each_class[i])
            num_selected_clients = len(selected_clients)
            num_per = num_all_samples / num_selected_clients
            if balance:
                num_samples = [int(num_per) for _ in range(num_selected_clients - 1)]
            else:
                num_samples = np.random.randint(
                    max(num_per / 10, least_samples / num_classes), num_per, num_selected_clients - 1
                ).tolist()
            num_samples.append(num_all_samples - sum(num_samples))
            idx = 0
            for client, num_sample in zip(selected_clients, num_samples):
                if client not in dataidx_map.keys():  # noqa: SIM118 (PFLlib's code as written)
                    dataidx_map[client] = idx_for_each_class[i][idx : idx + num_sample]
                else:
                    dataidx_map[client] = np.append(
                        dataidx_map[client], idx_for_each_class[i][idx : idx + num_sample], axis=0
                    )
                idx += num_sample
                class_num_per_client[client] -= 1
    else:
        min_size = 0
        K = num_classes
        N = len(dataset_label)
        while min_size < least_samples:
            idx_batch = [[] for _ in range(num_clients)]
            for k in range(K):
                idx_k = np.where(dataset_label == k)[0]
                np.random.shuffle(idx_k)
                proportions = np.random.dirichlet(np.repeat(alpha, num_clients))
                proportions = np.array([p * (len(idx_j) < N / num_clients) for p, idx_j in zip(proportions, idx_batch)])
                proportions = proportions / proportions.sum()
                proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
                idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
                min_size = min([len(idx_j) for idx_j in idx_batch])
        for j in range(num_clients):
            dataidx_map[j] = idx_batch[j]
    return [np.asarray(dataidx_map[c]) for c in range(num_clients)]


def pfllib_split_data(rows, train_ratio):
    train, test = [], []
    for r in rows:
        r_train, r_test = model_selection.train_test_split(r, train_size=train_ratio, shuffle=True)
        train.append(r_train)
        test.append(r_test)
    return train, test


def run_pfllib(labels, seed, split=False, **kwargs):
    """PFLlib's partition (and split) with `np.random.seed(seed)`; numpy's global state is restored afterwards."""
    state = np.random.get_state()
    try:
        np.random.seed(seed)
        rows = pfllib_separate_data(labels, **kwargs)
        return (rows, *pfllib_split_data(rows, 0.75)) if split else rows
    finally:
        np.random.set_state(state)


def pfllib_least(n, num_clients):
    return int(min(10 / (1 - 0.75), n / num_clients / 2))
