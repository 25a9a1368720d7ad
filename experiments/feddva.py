"""FedDVA (federated dual VAE): personalized classification vs FedAvg, FedAvg + fine-tuning and Ditto in the
heterogeneous-inputs and heterogeneous-outputs settings, plus the disentanglement evidence.

Datasets: --dataset=generated (default, no data needed), mnist (--data_dir with the IDX files, e.g.
../shared/data/mnist), fashion_mnist (--data_dir, default /usr/share/datasets/fashion-mnist from the Debian package
dataset-fashion-mnist) or cifar10 (--data_dir with the python batches). Writes metrics, checkpoints, results.json,
accuracy_vs_rounds.png and the manifold/projection figures to --output_dir.

  python experiments/feddva.py --flagfile=configs/feddva_scaled.flags --dataset=mnist \
      --data_dir=../shared/data/mnist --output_dir=/tmp/feddva
"""

from absl import app
from absl import flags
from absl import logging

from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import feddva

_DEFAULTS = {'output_dir': 'output/feddva'}
config_flags.define_flags(feddva.FeddvaConfig, overrides=_DEFAULTS)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.INFO)
    try:
        config = config_flags.config_from_flags(feddva.FeddvaConfig, overrides=_DEFAULTS)
        with runtime.LocalRuntime():
            results = feddva.run(config)
    except (ValueError, TypeError, flags.IllegalFlagValueError) as error:
        raise app.UsageError(str(error)) from None
    print(f'\nDataset: {results["dataset"]} ({results["rounds"]} rounds)')
    print(feddva.format_tables(results['rows']))
    print(f'\nOutputs: {config.output_dir}')


if __name__ == '__main__':
    app.run(main)
