r"""The classic personalization family on PFLlib's benchmark (label-skewed Fashion-MNIST, 20 clients, its 4-layer
CNN): FedAvg, FedProx, Ditto, APFL, FedPer, FedRep, LG-FedAvg, each a client plan on the fast engine.

Writes each method's metrics, checkpoints and client states to --output_dir/<method>, and results.json plus
accuracy_by_round.png to --output_dir. Data: Fashion-MNIST from /usr/share/datasets/fashion-mnist (Debian package
dataset-fashion-mnist) or --data_dir, or a prepared TFDS directory (--tfds_data_dir); --dataset=synthetic needs no
data. The leaderboard's two settings are configs/pfllib_fmnist_pathological.flags and
configs/pfllib_fmnist_dirichlet.flags.

  python experiments/pfl_benchmark.py --flagfile=configs/pfllib_fmnist_dirichlet.flags --output_dir=/tmp/pfl
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import pfl_benchmark_config


def report(results: dict[str, Any], config: Any) -> str:
    """The table printed at the end of the run."""
    del config
    from fedpersonal.tasks import pfl_benchmark  # pylint: disable=g-import-not-at-top  # TensorFlow, once parsed.

    header = f'{results["dataset"]}, {results["partition"]} partition, {results["clients"]} clients\n'
    return header + pfl_benchmark.format_table(results)


main = experiment_main.define_main(
    pfl_benchmark_config.PflBenchmarkConfig,
    'fedpersonal.tasks.pfl_benchmark:run',
    report,
    default_output_dir='output/pfl_benchmark',
)

if __name__ == '__main__':
    experiment_main.run(main)
