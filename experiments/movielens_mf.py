"""MovieLens matrix factorization with Federated Reconstruction (the FedRecon paper's Table 1).

Runs any of the five Table 1 configurations on MovieLens 100K/1M read from
--data_dir (GroupLens layout), or on generated MovieLens-like data when no
--data_dir is given. Writes per-round metrics (CSV, TensorBoard), checkpoints
(resumable), config.json, results.json and learning-curve PNGs to --output_dir.

  python experiments/movielens_mf.py --flagfile=configs/movielens_demo.flags --output_dir=/tmp/demo
  python experiments/movielens_mf.py --flagfile=configs/movielens_100k_table1.flags \
      --data_dir=/path/to/ml-100k --output_dir=/tmp/table1
"""

from absl import app
from absl import flags
from absl import logging

from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import movielens_mf

_DEFAULTS = {'output_dir': 'output/movielens_mf'}
config_flags.define_flags(
    movielens_mf.MovieLensMFConfig,
    overrides=_DEFAULTS,
)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.INFO)
    try:
        config = config_flags.config_from_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
        with runtime.LocalRuntime():
            results = movielens_mf.run(config)
    except (ValueError, TypeError, flags.IllegalFlagValueError) as error:
        # Configuration and data errors name the flag, file, line or client; no TF stack trace.
        raise app.UsageError(str(error)) from None
    print(f'\nDataset: {results["dataset"]}')
    print(movielens_mf.format_table(results['rows']))
    print(f'\nOutputs: {config.output_dir}')


if __name__ == '__main__':
    app.run(main)
