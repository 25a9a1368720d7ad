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

# Next-word prediction corpora (fedpersonal.data.text_corpus and loaders); token ids: fedpersonal.data.text_pipeline.
from fedpersonal.data.shakespeare import ShakespeareFormatError, load_shakespeare  # noqa: E402
from fedpersonal.data.stackoverflow import StackOverflowFormatError, load_stackoverflow  # noqa: E402
from fedpersonal.data.synthetic_text import generate_text_corpus  # noqa: E402
from fedpersonal.data.text_corpus import TextCorpus  # noqa: E402

# HPFL cross-silo user modeling (fedpersonal.data.user_modeling and loaders).
from fedpersonal.data.hpfl_assistments import load_assist_silos  # noqa: E402
from fedpersonal.data.hpfl_movielens import load_movielens_silos  # noqa: E402
from fedpersonal.data.synthetic_user_modeling import generate_user_modeling  # noqa: E402
from fedpersonal.data.user_modeling import ClientSilo, UserModelingData  # noqa: E402

__all__ += [
    'ClientSilo',
    'ShakespeareFormatError',
    'StackOverflowFormatError',
    'TextCorpus',
    'UserModelingData',
    'generate_text_corpus',
    'generate_user_modeling',
    'load_assist_silos',
    'load_movielens_silos',
    'load_shakespeare',
    'load_stackoverflow',
]
