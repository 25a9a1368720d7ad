r"""The classic personalization family on PFLlib's benchmark (label-skewed Fashion-MNIST, 20 clients, its 4-layer
CNN): FedAvg, FedProx, Ditto, APFL, FedPer, FedRep, LG-FedAvg, ..., each a client plan on the fast engine.

Every method runs once per seed of --seeds (default 0,1,2): each run's metrics, checkpoints, client states and row
(results.json) go to --output_dir/<method>/seed<k>; results.json (the rows as mean and std over the seeds) and
accuracy_by_round.png (mean over seeds, band +- 1 std) to --output_dir. A rerun resumes: finished runs are read
back, an interrupted one continues from its last checkpoint, and --configurations or --seeds may grow.
benchmarks/pfl_benchmark_table.py turns the two partitions' directories into docs/results/pfl_benchmark.json.

Data: Fashion-MNIST from /usr/share/datasets/fashion-mnist (Debian package
dataset-fashion-mnist) or --data_dir, or a prepared TFDS directory (--tfds_data_dir); --dataset=synthetic needs no
data. The leaderboard's two settings are configs/pfllib_fmnist_pathological.flags and
configs/pfllib_fmnist_dirichlet.flags. --dataset=movielens (MovieLens 100K from --data_dir, e.g. /tmp/ml-100k) runs the
rating block (fedpersonal/tasks/pfl_benchmark_movielens.py: matrix factorization, one client per user, rows by RMSE):
configs/pfl_movielens_100k.flags; --dataset=movielens_synthetic generates MovieLens-shaped ratings.

  python experiments/pfl_benchmark.py --flagfile=configs/pfllib_fmnist_dirichlet.flags --output_dir=/tmp/pfl

Your own images and model (docs/DATA.md): --dataset=npz --data_path=digits.npz (arrays x, images [N, H, W(, C)], and
y, integer labels; results labelled 'digits') and --model=mypackage.models:small_cnn (a Keras model factory by import
path; its last Dense layer is the head). PFLlib's CNN, the default, needs images of at least 16 x 16:

  python experiments/pfl_benchmark.py --dataset=npz --data_path=digits.npz \
      --model=fedpersonal.models.image_classifiers:small_cnn --num_clients=5 --output_dir=/tmp/pfl_digits
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import pfl_benchmark_config


def report(results: dict[str, Any], config: Any) -> str:
    """The table printed at the end of the run."""
    del config
    from fedpersonal.tasks import pfl_benchmark_results  # pylint: disable=g-import-not-at-top

    return pfl_benchmark_results.markdown_table(pfl_benchmark_results.docs_rows(results))


main = experiment_main.define_main(
    pfl_benchmark_config.PflBenchmarkConfig,
    'fedpersonal.tasks.pfl_benchmark:run',
    report,
    default_output_dir='output/pfl_benchmark',
    engine_workers=True,  # Every method on the engine runs its rounds on --engine_workers (pfl_benchmark.worker_setup).
)

if __name__ == '__main__':
    experiment_main.run(main)
