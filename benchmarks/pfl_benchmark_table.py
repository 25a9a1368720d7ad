r"""PFLlib's leaderboard beside this package: docs/results/pfl_benchmark.json, one plot per partition, the table.

Reads finished runs of experiments/pfl_benchmark.py (one --output_dir per partition, every method with its seeds):

  python experiments/pfl_benchmark.py --flagfile=configs/pfllib_fmnist_pathological.flags --output_dir=output/pfl_pat
  python experiments/pfl_benchmark.py --flagfile=configs/pfllib_fmnist_dirichlet.flags --output_dir=output/pfl_dir
  python experiments/pfl_benchmark.py --flagfile=configs/pfl_movielens_100k.flags --data_dir=/tmp/ml-100k \
      --output_dir=output/pfl_ml
  python benchmarks/pfl_benchmark_table.py --runs=output/pfl_pat,output/pfl_dir,output/pfl_ml \
      --output=docs/results/pfl_benchmark.json --explanations=explanations.json

and writes the rows (`fedpersonal.tasks.pfl_benchmark_results.docs_rows`: name, dataset, partition, clients, rounds,
accuracy and its std over seeds, best so far, slope of the last 10% of rounds, seeds, worst client, seconds per
round, and PFLlib's number with an explanation where its leaderboard has the method; the MovieLens block's rows
(dataset movielens_100k, partition by_user) by RMSE, with the rating accuracy), the accuracy (RMSE) by round of
each partition next to the JSON (``<output stem>_<partition>.png``, mean over seeds with a +- 1 std band), and
prints the markdown table for docs/RESULTS.md.

With ``--update`` the runs' rows replace the rows of the same partition and method in --output, the others kept
(e.g. one method rerun after a change; `fedpersonal.tasks.pfl_benchmark_results.updated_results`); a partition's
figure is redrawn from the file's rows when every row of it has its curves, else kept and named.

Explanations (why a row differs from PFLlib's number) are written by a person after the runs, never here:
``--explanations`` is a JSON file ``{"pathological": {"FedAvg": "text", ...}, "dirichlet": {...}}`` (row names or
method keys; for each partition it names, it replaces the explanations already in --output); without one, those are
kept, and a leaderboard row without any gets ``"explanation": null`` (listed when the script ends).
"""

import json
import os

from absl import app
from absl import flags
from absl import logging

from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.tasks import pfl_benchmark_results as results_lib

flags.DEFINE_list('runs', None, 'Output directories of finished experiments/pfl_benchmark.py runs, one per partition.')
flags.DEFINE_string('output', 'docs/results/pfl_benchmark.json', 'The results file written.')
flags.DEFINE_string('explanations', None, 'JSON {partition: {row name: text}}; default: those already in --output.')
flags.DEFINE_bool('update', False, "Replace only the runs' methods' rows of --output, keeping the others.")
flags.mark_flag_as_required('runs')
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    logging.set_verbosity(logging.INFO)
    explanations = results_lib.previous_explanations(FLAGS.output)
    if FLAGS.explanations:
        with open(FLAGS.explanations) as f:
            for partition, texts in json.load(f).items():  # The file's texts replace a partition's earlier ones.
                explanations[partition] = dict(texts)
    contents = results_lib.docs_results(FLAGS.runs, explanations)
    stem = os.path.splitext(FLAGS.output)[0]
    figures, drawn = {}, []
    if FLAGS.update:
        with open(FLAGS.output) as f:
            previous = json.load(f)
        contents = results_lib.updated_results(previous, contents)
        figures = dict(previous.get('figures') or {})
    for run_dir in FLAGS.runs:
        results, _ = results_lib.read_run(run_dir)
        if FLAGS.update:
            rows = [
                r
                for r in contents['rows']
                if (r['dataset'], r['partition']) == (results['dataset'], results['partition'])
            ]
            if not all(r.get('curve') for r in rows):
                print(
                    f'{results["partition"]}: figure kept (rows without curves: {[r["name"] for r in rows if not r.get("curve")]})'
                )
                continue
            results = {**results, 'rows': rows}
        figures[results['partition']] = results_lib.plot_by_round(results, f'{stem}_{results["partition"]}.png')
        drawn.append(figures[results['partition']])
    contents['figures'] = figures
    program.write_json(FLAGS.output, contents)
    print(results_lib.markdown_table(contents['rows']))
    print()
    for key, run in contents['runs'].items():
        print(f'{key}: `{run["command"]}`')
    print(f'Written: {FLAGS.output}, {", ".join(p for p in drawn if p)}')
    pending = [f'{r["partition"]}/{r["name"]}' for r in contents['rows'] if 'explanation' in r and not r['explanation']]
    few_seeds = [f'{r["partition"]}/{r["name"]}' for r in contents['rows'] if len(r['seeds']) < 3]
    if pending:
        print(f'Rows beside the leaderboard without an explanation yet: {", ".join(pending)}')
    if few_seeds:
        print(f'Rows with fewer than 3 seeds: {", ".join(few_seeds)}')


if __name__ == '__main__':
    with runtime.LocalRuntime():  # Releases TFF's import-time context before exit (else its __del__ fails).
        app.run(main)
