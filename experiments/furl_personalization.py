"""FURL: Global/Personalized x Server/FL (Bui et al., "Federated User Representation Learning").

Datasets: --dataset=synthetic_subreddit (generated default, no data needed), movielens_likes
(--data_dir with MovieLens 100K u.data + u.item; label: rating >= 4, document: the movie title, features: genres)
or assistments (--data_dir with record.csv/item.csv of ASSISTments 2009-2010 a0910; students are clients), or csv
(--data_path with your own responses or ratings table; docs/DATA.md).
--data_dir without --dataset: the dataset whose files are there (never generated data).
Writes metrics (CSV, TensorBoard), checkpoints + the client state store (resumable), results.json, learning
curves and the user-embedding projection to --output_dir.

  python experiments/furl_personalization.py --flagfile=configs/furl_synthetic_subreddit.flags --output_dir=/tmp/furl
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import furl_personalization_config


def report(results: dict[str, Any], config: Any) -> str:
    """The tables printed at the end of the run."""
    del config
    # The task module imports TensorFlow: here, once the flags are parsed, not at the top level.
    from fedpersonal.tasks import furl_personalization  # pylint: disable=g-import-not-at-top

    binary = results['statistics'].get('num_classes') == 2
    lines = [
        f'Dataset: {results["dataset"]} ({results["rounds"]} FL rounds)',
        furl_personalization.format_table(results['rows'], binary),
    ]
    if 'embeddings' in results:
        e = results['embeddings']
        lines.append(
            f'\nUser-embedding {e["knn_k"]}-NN overlap, server vs FL: {e["knn_overlap"]:.3f} '
            f'(chance {e["knn_chance"]:.3f})'
        )
    return '\n'.join(lines)


main = experiment_main.define_main(
    furl_personalization_config.FurlConfig,
    'fedpersonal.tasks.furl_personalization:run',
    report,
    default_output_dir='output/furl',
)

if __name__ == '__main__':
    experiment_main.run(main)
