"""HPFL user modeling (Wu et al., WWW 2021): centralized NCD/NCF/GUM, federated baselines, HPFL and its ablations.

Datasets: --dataset=synthetic (generated default, no data needed), assist (--data_dir with record.csv/item.csv of
ASSISTments 2009-2010 a0910; students grouped into school-like silos by the exercises they were given) or movielens
(--data_dir with MovieLens 100K u.data/u.item/u.user; silos = first digit of the zip code). Writes per-method metrics
(CSV, TensorBoard), results.json, learning curves, the attribute-distribution figure and the private-components
projection to --output_dir.

  python experiments/hpfl_user_modeling.py --flagfile=configs/hpfl_synthetic.flags --output_dir=/tmp/hpfl
"""

from absl import app
from absl import flags
from absl import logging

from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import hpfl_user_modeling

_DEFAULTS = {'output_dir': 'output/hpfl'}
config_flags.define_flags(hpfl_user_modeling.HpflConfig, overrides=_DEFAULTS)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.INFO)
    try:
        config = config_flags.config_from_flags(hpfl_user_modeling.HpflConfig, overrides=_DEFAULTS)
        with runtime.LocalRuntime():
            results = hpfl_user_modeling.run(config)
    except (ValueError, TypeError, OSError, flags.IllegalFlagValueError) as error:
        raise app.UsageError(str(error)) from None
    print(f'\nDataset: {results["dataset"]} ({results["task"]} task, {results["rounds"]} federated rounds)')
    print(hpfl_user_modeling.format_statistics_table(results['statistics'], results['dataset']))
    print()
    print(hpfl_user_modeling.format_accuracy_table(results['rows'], results['task']))
    print()
    print(hpfl_user_modeling.format_ranking_table(results['rows']))
    if results['private_components']:
        print()
        print(hpfl_user_modeling.format_private_table(results['private_components']))
    print(f'\nOutputs: {config.output_dir}')


if __name__ == '__main__':
    app.run(main)
