"""Next-word prediction with local OOV embeddings (the FedRecon paper's Table 2).

Trains FedYogi, FedRecon (1 and B OOV buckets) and the fine-tuning baselines for
every --vocab_sizes entry on Shakespeare (--dataset=shakespeare, read from
--data_dir), TFF's Stack Overflow SQLite file (--dataset=stackoverflow
--data_dir=PATH), or a generated corpus (default, no data needed). Writes
per-round metrics (CSV, TensorBoard; including measured communication),
checkpoints (resumable), config.json, results.json and learning curves to
--output_dir.

  python experiments/next_word_prediction.py --flagfile=configs/nwp_synthetic.flags --output_dir=/tmp/nwp
  python experiments/next_word_prediction.py --flagfile=configs/nwp_shakespeare.flags \
      --data_dir=../shared/data/shakespeare --output_dir=/tmp/nwp_shakespeare
"""

from absl import app
from absl import flags
from absl import logging

from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import next_word_prediction

_DEFAULTS = {'output_dir': 'output/next_word_prediction'}
config_flags.define_flags(next_word_prediction.NextWordPredictionConfig, overrides=_DEFAULTS)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.INFO)
    try:
        config = config_flags.config_from_flags(next_word_prediction.NextWordPredictionConfig, overrides=_DEFAULTS)
        with runtime.LocalRuntime():
            results = next_word_prediction.run(config)
    except (ValueError, TypeError, flags.IllegalFlagValueError) as error:
        # Configuration and data errors name the flag, file, line or client; no TF stack trace.
        raise app.UsageError(str(error)) from None
    print(f'\nDataset: {results["dataset"]}')
    for metric in ('accuracy_no_oov_no_eos', 'accuracy_no_oov', 'accuracy'):
        print(f'\n{metric} (%):')
        print(next_word_prediction.format_table(results['tables'], metric))
    print(f'\nOutputs: {config.output_dir}')


if __name__ == '__main__':
    app.run(main)
