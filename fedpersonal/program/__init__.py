"""Experiment programs: resumable training loop and the output directory."""

from fedpersonal.program.outputs import ExperimentOutputs
from fedpersonal.program.outputs import flatten_metrics
from fedpersonal.program.outputs import plot_curves
from fedpersonal.program.outputs import replace_marked_section
from fedpersonal.program.outputs import save_figure
from fedpersonal.program.outputs import write_json
from fedpersonal.program.training_loop import ClientStatesLostError
from fedpersonal.program.training_loop import run_learning_process
from fedpersonal.program.training_loop import sample_clients
