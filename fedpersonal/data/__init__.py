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

# FURL document-classification tasks (fedpersonal.data.furl_tasks): MovieLens likes, ASSISTments, synthetic Subreddit.
from fedpersonal.data.assistments import AssistmentsFormatError, load_assistments  # noqa: E402
from fedpersonal.data.furl_tasks import FurlData  # noqa: E402
from fedpersonal.data.movielens_likes import load_movielens_likes  # noqa: E402
from fedpersonal.data.synthetic_subreddit import generate_subreddit_like  # noqa: E402

__all__ += [
    'AssistmentsFormatError',
    'FurlData',
    'generate_subreddit_like',
    'load_assistments',
    'load_movielens_likes',
]
