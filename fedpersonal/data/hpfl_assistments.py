"""ASSISTments 2009-2010 (a0910) as cross-silo HPFL user-modeling data: students grouped into school-like silos.

The a0910 files (``record.csv``, ``item.csv``, optionally ``dict_knowledge_code.json``; read with
`fedpersonal.data.assistments.load_assistments_records` / `load_assistments_items`) have no school or class column.
HPFL's clients are schools, whose students are given the same exercises (teachers assign problem sets), so each
school is non-IID in knowledge concepts. `load_assist_silos` derives such silos by clustering students on the
exercises they were given:

1. Students with fewer than ``min_records_per_user`` responses are dropped.
2. ``grouping='exercises'`` (default): each student is the binary vector of the exercises they answered (all their
   responses: which exercises a school gives is part of the layout, labels are not used), weighted by the smoothed
   inverse document frequency ``idf_j = ln((1 + n_students) / (1 + n_students_of_j)) + 1`` (sklearn's
   ``TfidfTransformer``: exercises given to few students, e.g. one class's problem set, weigh more than ones
   everybody did) and L2-normalized, so the dot product of two students is a weighted cosine overlap of their
   exercise sets (a soft Jaccard). The vectors are reduced to 64 dimensions by truncated SVD (sklearn
   ``TruncatedSVD(random_state=seed)``; skipped when the matrix is smaller) and L2-normalized again.
   ``grouping='concepts'``: each student is their concept distribution (the fraction of their responses touching
   each concept); on a0910 this gives far less balanced groups (from 3 students).
   ``grouping='random'``: students are dealt to clients by a seeded permutation (an IID control partition).
3. k-means (sklearn ``KMeans(num_clients, n_init=10, random_state=seed)``) on those vectors gives ``num_clients``
   groups. Groups are named ``assist_group_00``, ``assist_group_01``, ... in increasing order of their smallest
   student id; the result is a deterministic function of the files and the arguments.

The default ``num_clients=40`` gives 2,380 / 40 = 59.5 students per silo on a0910, the paper's mean school size
(3,477 students in 59 schools = 58.9; the paper used a larger ASSISTments extract). With the defaults the silos
have 19 to 137 students (median 55.5) and 753 to 75,961 responses (median 3,111; heavy users answer many common
exercises and cluster together, so the largest silo holds 29 % of the responses); the mean total-variation
distance of a silo's concept distribution to the pooled one is 0.61 (0.13 for ``grouping='random'``), and a median
silo lacks 64 of the 110 concepts (19 for ``'random'``).

Within a silo, local user indices follow increasing student id and local item indices increasing exercise id;
records keep file order. ``record.csv`` has no timestamps: the file order of a student's responses is their time
order, and each student's responses are split into train / validation / test in that order
(`fedpersonal.data.user_modeling.per_user_split`), or in a seeded random order with ``split_order='shuffle'``; a
warning gives the count of test responses whose exercise no training response has (the sign of a file stored in
exercise order). `build_silos` (the grouping and the silos) also builds the silos of a CSV responses table
(`fedpersonal.data.csv_tasks`), where ``grouping='column'`` takes the silos from the table's ``silo`` column. Attributes are the knowledge concepts: concept id ``c`` is
attribute ``c - 1``, ``K`` = the largest concept id in ``item.csv`` (110 for a0910), named from
``dict_knowledge_code.json`` when present (``{"name": id, ...}``), else ``concept_<id>``. Labels are the 0/1 scores.
"""

from __future__ import annotations

import json
import os

import numpy as np

from fedpersonal import errors
from fedpersonal import wording
from fedpersonal.data import assistments
from fedpersonal.data import interaction_splits
from fedpersonal.data import user_modeling
from fedpersonal.data.assistments import AssistmentsFormatError

__all__ = ['GROUPINGS', 'load_assist_silos']

GROUPINGS = ('exercises', 'concepts', 'random', 'column')
_NAMES_FILE = 'dict_knowledge_code.json'
_SVD_DIMENSIONS = 64


def _concept_names(data_dir: str, num_concepts: int) -> list[str]:
    names = [f'concept_{c}' for c in range(1, num_concepts + 1)]
    path = os.path.join(data_dir, _NAMES_FILE)
    if not os.path.isfile(path):
        return names
    try:
        with open(path, encoding='utf-8-sig') as f:
            mapping = json.load(f)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; RecursionError: deep nesting.
        raise AssistmentsFormatError(f'{path}: not valid JSON ({type(e).__name__}: {e})', path=path) from None
    if not isinstance(mapping, dict):
        raise AssistmentsFormatError(f'{path}: expected a JSON object {{"concept name": concept id}}', path=path)
    for name, code in mapping.items():
        if isinstance(code, bool) or not isinstance(code, int):
            raise AssistmentsFormatError(f'{path}: concept {name!r} has id {code!r}, expected an integer', path=path)
        if 1 <= code <= num_concepts:
            names[code - 1] = str(name)
    return names


def _student_vectors(
    grouping: str,
    user_index: np.ndarray,
    item_index: np.ndarray,
    num_users: int,
    num_items: int,
    multi_hot: np.ndarray,
    seed: int,
) -> np.ndarray:
    from sklearn.decomposition import TruncatedSVD  # Imported lazily: only clustering needs sklearn.
    from sklearn.feature_extraction.text import TfidfTransformer
    from sklearn.preprocessing import MultiLabelBinarizer
    from sklearn.preprocessing import normalize

    if grouping == 'concepts':
        counts = np.zeros((num_users, multi_hot.shape[1]))
        np.add.at(counts, user_index, multi_hot[item_index])
        return counts / counts.sum(axis=1, keepdims=True)
    # 'exercises': idf-weighted, L2-normalized exercise-set vectors (TfidfTransformer's smoothed idf and l2 norm on
    # the binary student x exercise matrix), reduced by truncated SVD.
    order = np.argsort(user_index, kind='stable')
    exercise_sets = np.split(item_index[order], np.cumsum(np.bincount(user_index, minlength=num_users))[:-1])
    given = MultiLabelBinarizer(classes=np.arange(num_items), sparse_output=True).fit_transform(exercise_sets)
    vectors = TfidfTransformer(norm='l2', smooth_idf=True, sublinear_tf=False).fit_transform(given)
    if min(vectors.shape) > _SVD_DIMENSIONS + 1:
        vectors = normalize(TruncatedSVD(_SVD_DIMENSIONS, random_state=seed).fit_transform(vectors))
    else:
        vectors = vectors.toarray()
    return vectors


def _group_students(
    grouping: str, vectors: np.ndarray | None, num_users: int, num_clients: int, seed: int
) -> np.ndarray:
    if grouping == 'random':
        return np.random.default_rng(seed).permutation(num_users) % num_clients
    from sklearn.cluster import KMeans

    return KMeans(num_clients, n_init=10, random_state=seed).fit_predict(vectors).astype(np.int64)


def _collapse_error(grouping: str, distinct: int, num_clients: int) -> errors.DataError:
    profile, profiles = (
        ('exercise set', 'exercise sets') if grouping == 'exercises' else ('concept mix', 'concept mixes')
    )
    return errors.DataError(
        f'the {grouping!r} grouping cannot form --assist_num_clients={num_clients} silos: the students have only '
        f'{wording.count(distinct, f"distinct {profiles}", f"distinct {profile}")} (students with the same '
        f'{profile} cannot be told apart by clustering). Use --assist_grouping=random (students dealt to silos by a seeded permutation), or give each '
        "student's silo in a silo column of a --dataset=csv responses table with --assist_grouping=column "
        '(docs/DATA.md).'
    )


def build_silos(
    *,
    user_ids: np.ndarray,
    user_index: np.ndarray,
    item_ids: np.ndarray,
    item_index: np.ndarray,
    label: np.ndarray,
    split: np.ndarray,
    item_attributes: np.ndarray,
    grouping: str,
    num_clients: int,
    seed: int,
    client_prefix: str,
    silo_of_user: np.ndarray | None = None,
    silo_names: tuple[str, ...] = (),
) -> list[user_modeling.ClientSilo]:
    """Groups users into silos (see the module docstring) and builds one `ClientSilo` per silo.

    Args:
        user_ids: int64 ``[U]`` original id of each dense user.
        user_index: int64 ``[N]`` dense user of each record (every user in ``range(U)`` has records).
        item_ids: int64 ``[I]`` original id of each dense item.
        item_index: int64 ``[N]`` dense item of each record.
        label: float32 ``[N]`` labels.
        split: int8 ``[N]`` train / validation / test of each record (`user_modeling.per_user_split`).
        item_attributes: float32 ``[I, K]`` multi-hot attributes of each dense item.
        grouping: One of `GROUPINGS`; ``'column'`` takes `silo_of_user`.
        num_clients: Silos to form (ignored by ``'column'``).
        seed: Seed of the SVD and k-means, or of the ``'random'`` permutation.
        client_prefix: Client ids of formed silos: ``f'{client_prefix}{c:02d}'``.
        silo_of_user: ``'column'``: int64 ``[U]`` dense silo of each user.
        silo_names: ``'column'``: the client id of each dense silo.

    Returns:
        The silos; records keep their order.

    Raises:
        errors.DataError: Clustering cannot form `num_clients` groups (the message names the fix).
    """
    if grouping not in GROUPINGS:
        raise errors.ConfigError(f'--assist_grouping must be one of {GROUPINGS}, got {grouping!r}')
    num_users = int(user_ids.size)
    if grouping == 'column':
        if silo_of_user is None:
            raise errors.ConfigError('--assist_grouping=column needs a silo column in the data')
        used = np.unique(silo_of_user)
        cluster = np.searchsorted(used, silo_of_user)
        names = [str(silo_names[s]) for s in used]
    else:
        if num_users < num_clients:
            raise errors.DataError(
                f'--assist_num_clients={num_clients} silos need as many students; the data has '
                f'{wording.count(num_users, "students")}'
            )
        used_items, local_item = np.unique(item_index, return_inverse=True)
        vectors = None
        if grouping != 'random':
            vectors = _student_vectors(
                grouping, user_index, local_item, num_users, used_items.size, item_attributes[used_items], seed
            )
            distinct = np.unique(np.round(np.asarray(vectors, dtype=np.float64), 9), axis=0).shape[0]
            if distinct < num_clients:
                raise _collapse_error(grouping, distinct, num_clients)
        cluster = _group_students(grouping, vectors, num_users, num_clients, seed)
        # Name clusters in increasing order of their smallest student id (users are in increasing id order).
        first_member = np.full(num_clients, num_users)
        np.minimum.at(first_member, cluster, np.arange(num_users))
        rename = np.empty(num_clients, dtype=np.int64)
        rename[np.argsort(first_member, kind='stable')] = np.arange(num_clients)
        cluster = rename[cluster]
        if np.bincount(cluster, minlength=num_clients).min() == 0:
            raise _collapse_error(grouping, int(np.unique(cluster).size), num_clients)
        width = len(str(num_clients - 1))
        names = [f'{client_prefix}{c:0{width}d}' for c in range(num_clients)]

    record_silo = cluster[user_index]
    silos = []
    for c, client_id in enumerate(names):
        rows = np.flatnonzero(record_silo == c)
        silo_users, local_user = np.unique(user_index[rows], return_inverse=True)
        silo_items, local_item = np.unique(item_index[rows], return_inverse=True)
        silos.append(
            user_modeling.ClientSilo(
                client_id=client_id,
                num_users=int(silo_users.size),
                num_items=int(silo_items.size),
                user=local_user.astype(np.int64),
                item=local_item.astype(np.int64),
                label=label[rows].astype(np.float32),
                split=split[rows],
                item_attributes=item_attributes[silo_items],
                global_user_ids=user_ids[silo_users].astype(np.int64),
                global_item_ids=item_ids[silo_items].astype(np.int64),
            )
        )
    return silos


def load_assist_silos(
    data_dir: str,
    *,
    num_clients: int = 40,
    min_records_per_user: int = 10,
    seed: int = 0,
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
    grouping: str = 'exercises',
    split_order: str = 'file',
) -> user_modeling.UserModelingData:
    """Loads ASSISTments a0910 as school-like silos (see the module docstring for how students are grouped).

    Args:
        data_dir: Directory with ``record.csv`` and ``item.csv`` (e.g. ``/work/shared/data/assist-a0910``).
        num_clients: Number of silos (<= number of students kept).
        min_records_per_user: Students with fewer responses are dropped (>= 3; every a0910 student has >= 16).
        seed: Seed of the SVD and k-means (or of the permutation of ``grouping='random'``).
        split: Per-student (train, validation, test) fractions of the responses, in `split_order`.
        grouping: ``'exercises'``, ``'concepts'`` or ``'random'`` (``'column'`` needs a silo column, which a0910
            lacks: `fedpersonal.data.csv_tasks.load_csv_silos` reads one).
        split_order: The order of each student's responses for the split: ``'file'`` (file order, taken as time
            order) or ``'shuffle'`` (a permutation seeded by `seed`).

    Returns:
        A valid `fedpersonal.data.user_modeling.UserModelingData`, binary task, named
        `fedpersonal.data.assistments.release_name` (``'assist_a0910'`` for the a0910 files).

    Raises:
        AssistmentsFormatError: A file is missing or malformed, or a response names an exercise that ``item.csv``
            does not list (the message names the file and line).
        ValueError: Bad arguments, or too few students for `num_clients`.
    """
    if grouping not in GROUPINGS:
        raise errors.ConfigError(f'grouping must be one of {GROUPINGS}, got {grouping!r}')
    if grouping == 'column':
        raise errors.ConfigError(
            '--assist_grouping=column takes the silo column of a --dataset=csv responses table; record.csv of '
            "--dataset=assistments has none: use --assist_grouping 'exercises', 'concepts' or 'random'."
        )
    if split_order not in ('file', 'shuffle'):
        raise errors.ConfigError(
            f"split_order must be 'file' or 'shuffle' (record.csv has no timestamps), got {split_order!r}"
        )
    if min_records_per_user < 3:
        raise errors.ConfigError(
            f'min_records_per_user must be >= 3 (every student needs train, validation and test '
            f'records), got {min_records_per_user}'
        )
    if num_clients < 1:
        raise errors.ConfigError(f'num_clients must be >= 1, got {num_clients}')
    data_dir = os.fspath(data_dir)
    users, items, scores = assistments.load_assistments_records(data_dir)
    item_ids, concepts = assistments.load_assistments_items(data_dir)

    order = np.argsort(item_ids, kind='stable')
    sorted_ids = item_ids[order]
    position = np.minimum(np.searchsorted(sorted_ids, items), sorted_ids.size - 1)
    unknown = np.flatnonzero(sorted_ids[position] != items)
    if unknown.size:
        i = int(unknown[0])
        path = os.path.join(data_dir, 'record.csv')
        raise AssistmentsFormatError(
            f'{path} line {i + 2}: item_id {int(items[i])} is not in {os.path.join(data_dir, "item.csv")} '
            f'({wording.count(unknown.size, "responses")} with an unknown item)',
            path=path,
            line=i + 2,
        )
    num_concepts = max(max(c) for c in concepts)
    multi_hot = np.zeros((item_ids.size, num_concepts), dtype=np.float32)  # Rows in increasing item id.
    for row, codes in enumerate(concepts[i] for i in order):
        multi_hot[row, np.asarray(codes) - 1] = 1.0

    _, inverse, counts = np.unique(users, return_inverse=True, return_counts=True)
    keep = counts[inverse] >= min_records_per_user
    users, position, scores = users[keep], position[keep], scores[keep]
    user_ids, user_index = np.unique(users, return_inverse=True)
    if user_ids.size < num_clients:
        raise errors.DataError(
            f'{wording.count(user_ids.size, "students")} with >= {min_records_per_user} responses, fewer than '
            f'num_clients={num_clients}'
        )
    if split_order == 'shuffle':  # A seeded random order of every student's responses.
        permutation = np.random.default_rng(seed).permutation(user_index.size)
        user_index, position, scores = user_index[permutation], position[permutation], scores[permutation]
    split_of_record = user_modeling.per_user_split(user_index, split)
    interaction_splits.warn_unseen_in_training(
        position, split_of_record, source=os.path.join(data_dir, 'record.csv'), what='exercises'
    )
    silos = build_silos(
        user_ids=user_ids,
        user_index=user_index,
        item_ids=sorted_ids,
        item_index=position,
        label=scores.astype(np.float32),
        split=split_of_record,
        item_attributes=multi_hot,
        grouping=grouping,
        num_clients=num_clients,
        seed=seed,
        client_prefix='assist_group_',
    )
    name = assistments.release_name(data_dir)
    source = (
        f'{data_dir} ({name}): {num_clients} silos by {grouping!r} grouping (seed {seed}), '
        f'students with >= {min_records_per_user} responses, per-student {split_order}-order split {tuple(split)}'
    )
    return user_modeling.validate(
        user_modeling.UserModelingData(
            name=name,
            task='binary',
            num_attributes=num_concepts,
            attribute_names=_concept_names(data_dir, num_concepts),
            rating_range=(0.0, 1.0),
            silos=silos,
            source=source,
        )
    )
