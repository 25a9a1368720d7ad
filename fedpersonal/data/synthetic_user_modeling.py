"""Generated cross-silo user-modeling data (the default HPFL dataset when no real data is named).

`generate_user_modeling` returns a `fedpersonal.data.user_modeling.UserModelingData` of realistic shape, from a
cognitive-diagnosis-like model, so a General User Model can learn it; `generate_user_modeling_with_truth` also returns
the generating parameters (e.g. to check that DOA of the true abilities is high). Generative model:

* ``K = num_attributes`` attributes; ``num_items`` global items, each with 1, 2 or 3 distinct attributes (probabilities
  0.6 / 0.3 / 0.1), a difficulty ``b[j, k] ~ N(0, 1)`` per attribute it has, a discrimination
  ``a[j] ~ LogNormal(0, 0.25)``, a slip ``s[j] ~ U(0.05, 0.2)`` and a guess ``g[j] ~ U(0.05, 0.25)``;
* each client ``c`` has an attribute mix ``m[c] ~ Dirichlet(attribute_concentration)`` (small concentration = clients
  specialise in a few attributes: non-IID) and draws ``items_per_client`` distinct items with probability
  proportional to ``1e-3 + min of m[c] over the item's attributes`` (an item is likely only if all its attributes
  are in the client's mix), so attributes outside its mix are often missing for it;
* each user of client ``c`` has a latent per-attribute ability ``theta[u, k] = o[c, k] + e[u, k]`` with a client
  offset ``o[c, k] ~ N(0, client_ability_std)`` and ``e[u, k] ~ N(0, 1)``, and answers ``n_u`` distinct items of their
  client (``n_u`` uniform in ``records_per_user``), in a random order that is their time order;
* for a record of user ``u`` on item ``j``: ``z = a[j] * mean over j's attributes k of (theta[u, k] - b[j, k])`` and
  the mastery ``eta = sigmoid(1.7 z)``; ``task='binary'``: the answer is correct with probability
  ``(1 - s[j]) * eta + g[j] * (1 - eta)`` (slip and guess, as DINA / the GUM's prediction); ``task='rating'``: the
  rating is ``clip(round(3.2 + 1.1 z + N(0, 0.6^2)), 1, 5)``.

Each user's records are split into train / validation / test in their time order
(`fedpersonal.data.user_modeling.per_user_split`). Global user ids are ``1..`` in client order, global item ids
``1..num_items``. The defaults (8 clients x 40 users x 20-60 records, 80 of 400 items per client, 12 attributes)
take well under a second and give about 12,900 records, a mean total-variation distance of 0.39 between a client's
attribute distribution and the pooled one (non-IID) and 2-3 missing attributes per client.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedpersonal import errors
from fedpersonal.data import user_modeling

__all__ = ['SyntheticTruth', 'generate_user_modeling', 'generate_user_modeling_with_truth']

_ATTRIBUTE_COUNT_PROBABILITIES = (0.6, 0.3, 0.1)
_RATING_MEAN = 3.2
_RATING_SCALE = 1.1
_RATING_NOISE = 0.6


@dataclasses.dataclass(frozen=True)
class SyntheticTruth:
    """Generating parameters, one entry per silo (in the order of ``data.silos``, local indices).

    Attributes:
        user_ability: ``[num_users, K]`` float64 latent abilities ``theta`` of each silo's users.
        item_difficulty: ``[num_items, K]`` float64 difficulties ``b`` of each silo's items (0 where the item lacks
            the attribute).
        expected_label: ``[n_records]`` float64: probability of a correct answer (binary task) or the noiseless
            rating ``3.2 + 1.1 z`` (rating task), per record of each silo.
    """

    user_ability: list[np.ndarray]
    item_difficulty: list[np.ndarray]
    expected_label: list[np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def generate_user_modeling_with_truth(
    *,
    num_clients: int = 8,
    num_attributes: int = 12,
    num_items: int = 400,
    items_per_client: int = 80,
    users_per_client: int = 40,
    records_per_user: tuple[int, int] = (20, 60),
    attribute_concentration: float = 0.2,
    client_ability_std: float = 0.7,
    task: str = 'binary',
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> tuple[user_modeling.UserModelingData, SyntheticTruth]:
    """`generate_user_modeling` plus the generating parameters (see the module docstring).

    Args:
        num_clients: Number of clients (silos).
        num_attributes: ``K``.
        num_items: Number of global items.
        items_per_client: Distinct items a client draws (<= num_items).
        users_per_client: Users per client.
        records_per_user: ``(min, max)`` records of a user, inclusive; ``3 <= min <= max <= items_per_client``.
        attribute_concentration: Dirichlet concentration of the clients' attribute mixes (> 0; small = non-IID).
        client_ability_std: Standard deviation of the per-client ability offsets (>= 0).
        task: ``'binary'`` (0/1 correctness) or ``'rating'`` (1..5).
        split: Per-user (train, validation, test) fractions.
        seed: Seed; the output is a deterministic function of all arguments.

    Returns:
        ``(data, truth)``.

    Raises:
        ValueError: An argument is out of range.
    """
    if task not in user_modeling.TASKS:
        raise errors.ConfigError(f'task must be one of {user_modeling.TASKS}, got {task!r}')
    if min(num_clients, num_attributes, users_per_client) < 1:
        raise errors.ConfigError(
            f'num_clients, num_attributes and users_per_client must be >= 1, got {num_clients}, '
            f'{num_attributes}, {users_per_client}'
        )
    if not 1 <= items_per_client <= num_items:
        raise errors.ConfigError(f'items_per_client must be in [1, num_items={num_items}], got {items_per_client}')
    low, high = records_per_user
    if not 3 <= low <= high <= items_per_client:
        raise errors.ConfigError(
            f'records_per_user must be (min, max) with 3 <= min <= max <= items_per_client='
            f'{items_per_client}, got {records_per_user}'
        )
    if attribute_concentration <= 0 or client_ability_std < 0:
        raise errors.ConfigError(
            f'attribute_concentration must be > 0 and client_ability_std >= 0, got '
            f'{attribute_concentration}, {client_ability_std}'
        )

    rng = np.random.default_rng(seed)
    k = num_attributes
    # Items: 1-3 attributes each, per-attribute difficulty, discrimination, slip, guess.
    probabilities = np.asarray(_ATTRIBUTE_COUNT_PROBABILITIES[:k], dtype=np.float64)
    sizes = rng.choice(np.arange(1, probabilities.size + 1), size=num_items, p=probabilities / probabilities.sum())
    q = np.zeros((num_items, k), dtype=np.float32)
    for j, size in enumerate(sizes):
        q[j, rng.choice(k, size=size, replace=False)] = 1.0
    difficulty = rng.normal(0.0, 1.0, size=(num_items, k)) * q
    discrimination = rng.lognormal(0.0, 0.25, size=num_items)
    slip = rng.uniform(0.05, 0.2, size=num_items)
    guess = rng.uniform(0.05, 0.25, size=num_items)
    attribute_count = q.sum(axis=1)

    silos, abilities, difficulties, expected = [], [], [], []
    next_user_id = 1
    width = len(str(num_clients - 1))
    for c in range(num_clients):
        mix = rng.dirichlet(np.full(k, attribute_concentration))
        weight = 1e-3 + np.where(q > 0, mix[None, :], np.inf).min(axis=1)
        # Distinct items with probability proportional to weight (Gumbel top-k).
        pool = np.sort(np.argsort(-(np.log(weight) + rng.gumbel(size=num_items)))[:items_per_client])
        ability = rng.normal(0.0, client_ability_std, size=k)[None, :] + rng.normal(
            0.0, 1.0, size=(users_per_client, k)
        )
        counts = rng.integers(low, high + 1, size=users_per_client)
        items = np.concatenate([rng.choice(pool, size=n, replace=False) for n in counts])
        users = np.repeat(np.arange(users_per_client), counts)
        z = (
            discrimination[items]
            * ((ability[users] - difficulty[items]) * q[items]).sum(axis=1)
            / attribute_count[items]
        )
        if task == 'binary':
            eta = _sigmoid(1.7 * z)
            mean = (1.0 - slip[items]) * eta + guess[items] * (1.0 - eta)
            label = (rng.random(items.size) < mean).astype(np.float32)
        else:
            mean = _RATING_MEAN + _RATING_SCALE * z
            label = np.clip(np.rint(mean + rng.normal(0.0, _RATING_NOISE, size=items.size)), 1, 5).astype(np.float32)
        used_items, local_item = np.unique(items, return_inverse=True)
        silos.append(
            user_modeling.ClientSilo(
                client_id=f'synthetic_client_{c:0{width}d}',
                num_users=users_per_client,
                num_items=int(used_items.size),
                user=users.astype(np.int64),
                item=local_item.astype(np.int64),
                label=label,
                split=user_modeling.per_user_split(users, split),
                item_attributes=q[used_items],
                global_user_ids=np.arange(next_user_id, next_user_id + users_per_client, dtype=np.int64),
                global_item_ids=(used_items + 1).astype(np.int64),
            )
        )
        next_user_id += users_per_client
        abilities.append(ability)
        difficulties.append(difficulty[used_items])
        expected.append(mean)

    source = (
        f'generate_user_modeling(num_clients={num_clients}, num_attributes={num_attributes}, '
        f'num_items={num_items}, items_per_client={items_per_client}, users_per_client={users_per_client}, '
        f'records_per_user={tuple(records_per_user)}, attribute_concentration={attribute_concentration}, '
        f'client_ability_std={client_ability_std}, task={task!r}, split={tuple(split)}, seed={seed})'
    )
    data = user_modeling.validate(
        user_modeling.UserModelingData(
            name='synthetic_user_modeling',
            task=task,
            num_attributes=k,
            attribute_names=[f'attribute_{i:02d}' for i in range(k)],
            rating_range=(0.0, 1.0) if task == 'binary' else (1.0, 5.0),
            silos=silos,
            source=source,
        )
    )
    return data, SyntheticTruth(user_ability=abilities, item_difficulty=difficulties, expected_label=expected)


def generate_user_modeling(
    *,
    num_clients: int = 8,
    num_attributes: int = 12,
    num_items: int = 400,
    items_per_client: int = 80,
    users_per_client: int = 40,
    records_per_user: tuple[int, int] = (20, 60),
    attribute_concentration: float = 0.2,
    client_ability_std: float = 0.7,
    task: str = 'binary',
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> user_modeling.UserModelingData:
    """Generates cross-silo user-modeling data (see the module docstring for the model).

    Args: as `generate_user_modeling_with_truth`.

    Returns:
        A valid `fedpersonal.data.user_modeling.UserModelingData` named ``'synthetic_user_modeling'``.
    """
    return generate_user_modeling_with_truth(
        num_clients=num_clients,
        num_attributes=num_attributes,
        num_items=num_items,
        items_per_client=items_per_client,
        users_per_client=users_per_client,
        records_per_user=records_per_user,
        attribute_concentration=attribute_concentration,
        client_ability_std=client_ability_std,
        task=task,
        split=split,
        seed=seed,
    )[0]
