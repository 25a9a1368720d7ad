r"""MovieLens matrix factorization with Federated Reconstruction (the FedRecon paper's Table 1).

Runs any of the five Table 1 configurations on MovieLens 100K/1M read from
--data_dir (GroupLens layout), on your own ratings table (--dataset=csv
--data_path=FILE, user,item,rating[,timestamp]; docs/DATA.md), or on generated
MovieLens-like data when neither is given. Writes per-round metrics (CSV, TensorBoard), checkpoints
(resumable), config.json, results.json and learning-curve PNGs to --output_dir.

  python experiments/movielens_mf.py --flagfile=configs/movielens_demo.flags --output_dir=/tmp/demo
  python experiments/movielens_mf.py --flagfile=configs/movielens_100k_table1.flags \
      --data_dir=/path/to/ml-100k --output_dir=/tmp/table1
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import movielens_mf_config


def report(results: dict[str, Any], config: Any) -> str:
    """The tables printed at the end of the run."""
    del config
    # The task module imports TensorFlow: here, once the flags are parsed, not at the top level.
    from fedpersonal.tasks import movielens_mf  # pylint: disable=g-import-not-at-top

    return f'Dataset: {results["dataset"]}\n' + movielens_mf.format_table(results['rows'], results.get('baseline'))


main = experiment_main.define_main(
    movielens_mf_config.MovieLensMFConfig,
    'fedpersonal.tasks.movielens_mf:run',
    report,
    default_output_dir='output/movielens_mf',
    engine_workers=True,  # The FedRecon row's rounds on --engine_workers (movielens_mf.fedrecon_worker_setup).
)

if __name__ == '__main__':
    experiment_main.run(main)
