r"""Next-word prediction with local OOV embeddings (the FedRecon paper's Table 2).

Trains FedYogi, FedRecon (1 and B OOV buckets) and the fine-tuning baselines for
every --vocab_sizes entry on Shakespeare (--dataset=shakespeare, read from
--data_dir), TFF's Stack Overflow SQLite file (--dataset=stackoverflow
--data_dir=PATH), or a generated corpus (the default without --data_dir;
--data_dir without --dataset: the dataset whose files are there). Writes
per-round metrics (CSV, TensorBoard; including measured communication),
checkpoints (resumable), config.json, results.json and learning curves to
--output_dir.

  python experiments/next_word_prediction.py --flagfile=configs/nwp_synthetic.flags --output_dir=/tmp/nwp
  python experiments/next_word_prediction.py --flagfile=configs/nwp_shakespeare.flags \
      --data_dir=../shared/data/shakespeare --output_dir=/tmp/nwp_shakespeare
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import next_word_prediction_config


def report(results: dict[str, Any], config: Any) -> str:
    """The tables printed at the end of the run."""
    del config
    # The task module imports TensorFlow: here, once the flags are parsed, not at the top level.
    from fedpersonal.tasks import next_word_prediction  # pylint: disable=g-import-not-at-top

    lines = [f'Dataset: {results["dataset"]}']
    for metric in ('accuracy_no_oov_no_eos', 'accuracy_no_oov', 'accuracy'):
        lines += [f'\n{metric} (%):', next_word_prediction.format_table(results['tables'], metric)]
    return '\n'.join(lines)


main = experiment_main.define_main(
    next_word_prediction_config.NextWordPredictionConfig,
    'fedpersonal.tasks.next_word_prediction:run',
    report,
    default_output_dir='output/next_word_prediction',
)

if __name__ == '__main__':
    experiment_main.run(main)
