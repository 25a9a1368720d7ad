"""Data layer: MovieLens loading/preprocessing/splitting, TFF `ClientData`, and a synthetic MovieLens generator.

Importing this package does not import TensorFlow; `to_client_data` does so on first use.
"""

from fedpersonal.data.movielens import (
    RATING_COLUMNS,
    MovieLensData,
    MovieLensFormatError,
    dataset_statistics,
    load_ratings,
    preprocess_ratings,
    split_by_time,
    split_by_user,
    to_client_data,
)
from fedpersonal.data.synthetic_movielens import generate_movielens_like, write_movielens_100k_layout

__all__ = [
    'RATING_COLUMNS',
    'MovieLensData',
    'MovieLensFormatError',
    'dataset_statistics',
    'generate_movielens_like',
    'load_ratings',
    'preprocess_ratings',
    'split_by_time',
    'split_by_user',
    'to_client_data',
    'write_movielens_100k_layout',
]
