r"""FedDVA (federated dual VAE): personalized classification vs FedAvg, FedAvg + fine-tuning and Ditto in the
heterogeneous-inputs and heterogeneous-outputs settings, plus the disentanglement evidence.

Datasets: --dataset=synthetic (the default without --data_dir, no data needed), mnist (--data_dir with the IDX files, e.g.
../shared/data/mnist), fashion_mnist (--data_dir, default /usr/share/datasets/fashion-mnist from the Debian package
dataset-fashion-mnist) or cifar10 (--data_dir with the python batches). --data_dir without --dataset: the dataset
whose files are there (cifar10; MNIST and Fashion-MNIST have the same files, so name them). Writes metrics, checkpoints, results.json,
accuracy_vs_rounds.png and the manifold/projection figures to --output_dir. FedDVA and Ditto run on the fast
simulation engine (--simulation=engine, the default; --group_size caps the clients per compiled group);
--simulation=per_client runs one TFF client computation per client.

  python experiments/feddva.py --flagfile=configs/feddva_scaled.flags --dataset=mnist \
      --data_dir=../shared/data/mnist --output_dir=/tmp/feddva
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import feddva_config


def report(results: dict[str, Any], config: Any) -> str:
    """The tables printed at the end of the run."""
    del config
    # The task module imports TensorFlow: here, once the flags are parsed, not at the top level.
    from fedpersonal.tasks import feddva_analysis  # pylint: disable=g-import-not-at-top

    return f'Dataset: {results["dataset"]} ({results["rounds"]} rounds)\n' + feddva_analysis.format_tables(
        results['rows']
    )


main = experiment_main.define_main(
    feddva_config.FeddvaConfig, 'fedpersonal.tasks.feddva:run', report, default_output_dir='output/feddva'
)

if __name__ == '__main__':
    experiment_main.run(main)
