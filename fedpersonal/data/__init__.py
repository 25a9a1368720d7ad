"""Data layer: MovieLens loading/preprocessing/splitting, TFF `ClientData`, and a synthetic MovieLens generator.

Importing this package does not import TensorFlow; `to_client_data` does so on first use. `dataset_split` (the
support/query split of a client's dataset for reconstruction, re-exported by `fedpersonal.algorithms`) imports it
and is imported by name only.
"""

from fedpersonal.data.assistments import AssistmentsFormatError
from fedpersonal.data.assistments import load_assistments
from fedpersonal.data.csv_interactions import CsvFormatError
from fedpersonal.data.csv_tasks import load_csv_ratings
from fedpersonal.data.furl_tasks import FurlData
from fedpersonal.data.hpfl_assistments import load_assist_silos
from fedpersonal.data.hpfl_movielens import load_movielens_silos
from fedpersonal.data.movielens import RATING_COLUMNS
from fedpersonal.data.movielens import MovieLensData
from fedpersonal.data.movielens import MovieLensFormatError
from fedpersonal.data.movielens import dataset_statistics
from fedpersonal.data.movielens import load_ratings
from fedpersonal.data.movielens import preprocess_ratings
from fedpersonal.data.movielens import split_by_time
from fedpersonal.data.movielens import split_by_user
from fedpersonal.data.movielens import to_client_data
from fedpersonal.data.movielens_likes import load_movielens_likes
from fedpersonal.data.shakespeare import ShakespeareFormatError
from fedpersonal.data.shakespeare import load_shakespeare
from fedpersonal.data.stackoverflow import StackOverflowFormatError
from fedpersonal.data.stackoverflow import load_stackoverflow
from fedpersonal.data.synthetic_movielens import generate_movielens_like
from fedpersonal.data.synthetic_movielens import write_movielens_100k_layout
from fedpersonal.data.synthetic_subreddit import generate_subreddit_like
from fedpersonal.data.synthetic_text import generate_text_corpus
from fedpersonal.data.synthetic_user_modeling import generate_user_modeling
from fedpersonal.data.text_corpus import TextCorpus
from fedpersonal.data.user_modeling import ClientSilo
from fedpersonal.data.user_modeling import UserModelingData

__all__ = [
    # MovieLens rating prediction (FedRecon Table 1).
    'RATING_COLUMNS',
    'MovieLensData',
    'CsvFormatError',
    'MovieLensFormatError',
    'dataset_statistics',
    'generate_movielens_like',
    'load_csv_ratings',
    'load_ratings',
    'preprocess_ratings',
    'split_by_time',
    'split_by_user',
    'to_client_data',
    'write_movielens_100k_layout',
    # FURL document-classification tasks (fedpersonal.data.furl_tasks): MovieLens likes, ASSISTments, synthetic
    # Subreddit.
    'AssistmentsFormatError',
    'FurlData',
    'generate_subreddit_like',
    'load_assistments',
    'load_movielens_likes',
    # Next-word prediction corpora (fedpersonal.data.text_corpus and loaders); token ids:
    # fedpersonal.data.text_pipeline.
    'ShakespeareFormatError',
    'StackOverflowFormatError',
    'TextCorpus',
    'generate_text_corpus',
    'load_shakespeare',
    'load_stackoverflow',
    # HPFL cross-silo user modeling (fedpersonal.data.user_modeling and loaders).
    'ClientSilo',
    'UserModelingData',
    'generate_user_modeling',
    'load_assist_silos',
    'load_movielens_silos',
]
