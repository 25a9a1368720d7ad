"""An evaluation plan refuses what its backends would not run as stated, naming the problem."""

import numpy as np
import pytest
import tensorflow_federated as tff

from fedpersonal.algorithms import fed_recon
from fedpersonal.core import client_plan
from fedpersonal.core import eval_plan
from fedpersonal.data import dataset_split

SGD = tff.learning.optimizers.build_sgdm(0.1)
SPLIT = client_plan.DataSplit(('support', 'query'), lambda dataset: (dataset, dataset))


def _phase(**kwargs):
    return client_plan.Phase(
        **{'trains': ('local',), 'epochs': 1, 'optimizer': SGD, 'data': 'support', 'reports_metrics': False, **kwargs}
    )


@pytest.mark.parametrize(
    'plan_kwargs, message',
    [
        (dict(phases=(_phase(trains=('personal',)),), split=SPLIT), 'global and/or local'),
        (dict(phases=(_phase(reports_metrics=True),), split=SPLIT), 'reports no metrics'),
        (dict(phases=(_phase(penalty=client_plan.NormPenalty('local', 0.1)),), split=SPLIT), 'no penalty'),
        (dict(phases=(_phase(data='train'),), split=SPLIT), "'train' is not a part"),
        (dict(phases=(_phase(),)), "'support' is not a part"),
        (dict(split=SPLIT, scores='test'), "'test' is not a part"),
        (dict(local_start='sometimes'), 'local_start'),
    ],
)
def test_a_plan_its_backends_cannot_run_is_refused(plan_kwargs, message):
    with pytest.raises(ValueError, match=message):
        eval_plan.EvalPlan(**plan_kwargs)


def test_recon_eval_plan_reconstructs_then_finetunes_on_the_support_set_and_scores_the_query_set():
    split = dataset_split.ReconstructionSplit(post_recon_epochs=3, post_recon_steps_max=2)
    plan = fed_recon.recon_eval_plan(
        reconstruction_optimizer=SGD, dataset_split=split, finetune_optimizer=SGD, learn_local_init=True
    )
    assert [(p.trains, p.data) for p in plan.phases] == [(('local',), 'support'), (('global',), 'support')]
    assert (plan.scores, plan.local_start) == ('query', client_plan.LEARNED)
    batches = [{'x': np.array([[i], [i + 1]]), 'y': np.array([[0.0], [1.0]], np.float32)} for i in range(0, 20, 2)]
    assert plan.split is not None and plan.split.batches_fn is not None
    support, query = plan.split.batches_fn(batches)
    # The query set in one plain pass, whatever the training's epochs and cap.
    assert sum(len(b['x']) for b in support) + sum(len(b['x']) for b in query) == 20
