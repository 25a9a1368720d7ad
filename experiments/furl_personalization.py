"""FURL: Global/Personalized x Server/FL (Bui et al., "Federated User Representation Learning").

Datasets: --dataset=synthetic_subreddit (generated default, no data needed), movielens_likes
(--data_dir with MovieLens 100K u.data + u.item; label: rating >= 4, document: the movie title, features: genres)
or assistments (--data_dir with record.csv/item.csv of ASSISTments 2009-2010 a0910; students are clients).
Writes metrics (CSV, TensorBoard), checkpoints + the client state store (resumable), results.json, learning
curves and the user-embedding projection to --output_dir.

  python experiments/furl_personalization.py --flagfile=configs/furl_synthetic_subreddit.flags --output_dir=/tmp/furl
"""

from absl import app
from absl import flags
from absl import logging

from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import furl_personalization

_DEFAULTS = {'output_dir': 'output/furl'}
config_flags.define_flags(furl_personalization.FurlConfig, overrides=_DEFAULTS)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.INFO)
    try:
        config = config_flags.config_from_flags(furl_personalization.FurlConfig, overrides=_DEFAULTS)
        with runtime.LocalRuntime():
            results = furl_personalization.run(config)
    except (ValueError, TypeError, flags.IllegalFlagValueError) as error:
        raise app.UsageError(str(error)) from None
    binary = results['statistics'].get('num_classes') == 2
    print(f'\nDataset: {results["dataset"]} ({results["rounds"]} FL rounds)')
    print(furl_personalization.format_table(results['rows'], binary))
    if 'embeddings' in results:
        e = results['embeddings']
        print(f"\nUser-embedding {e['knn_k']}-NN overlap, server vs FL: {e['knn_overlap']:.3f} (chance {e['knn_chance']:.3f})")
    print(f'\nOutputs: {config.output_dir}')


if __name__ == '__main__':
    app.run(main)
