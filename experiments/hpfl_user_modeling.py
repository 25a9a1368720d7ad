"""HPFL user modeling (Wu et al., WWW 2021): centralized NCD/NCF/GUM, federated baselines, HPFL and its ablations.

Datasets: --dataset=synthetic (generated default, no data needed), assistments (--data_dir with record.csv/item.csv of
ASSISTments 2009-2010 a0910; students grouped into school-like silos by the exercises they were given) or movielens
(--data_dir with MovieLens 100K u.data/u.item/u.user; silos = first digit of the zip code) or csv (--data_path with
your own responses table, user,question,correct,skills[,timestamp][,silo], or ratings table with an attributes
column; docs/DATA.md); --data_dir without
--dataset: the dataset whose files are there (never generated data). Writes per-method metrics
(CSV, TensorBoard), results.json, learning curves, the attribute-distribution figure and the private-components
projection to --output_dir.

  python experiments/hpfl_user_modeling.py --flagfile=configs/hpfl_synthetic.flags --output_dir=/tmp/hpfl
"""

from typing import Any

from fedpersonal.program import experiment_main
from fedpersonal.tasks import hpfl_user_modeling_config


def report(results: dict[str, Any], config: Any) -> str:
    """The tables printed at the end of the run."""
    del config
    # The task module imports TensorFlow: here, once the flags are parsed, not at the top level.
    from fedpersonal.tasks import hpfl_user_modeling  # pylint: disable=g-import-not-at-top

    lines = [
        f'Dataset: {results["dataset"]} ({results["task"]} task, {results["rounds"]} federated rounds)',
        hpfl_user_modeling.format_statistics_table(results['statistics'], results['dataset']),
        '',
        hpfl_user_modeling.format_accuracy_table(results['rows'], results['task']),
        '',
        hpfl_user_modeling.format_ranking_table(results['rows']),
    ]
    if results['private_components']:
        lines += ['', hpfl_user_modeling.format_private_table(results['private_components'])]
    return '\n'.join(lines)


main = experiment_main.define_main(
    hpfl_user_modeling_config.HpflConfig,
    'fedpersonal.tasks.hpfl_user_modeling:run',
    report,
    default_output_dir='output/hpfl',
    engine_workers=True,  # Its federated rows run their rounds on --engine_workers (hpfl_user_modeling.worker_setup).
)

if __name__ == '__main__':
    experiment_main.run(main)
