"""Experiment programs: resumable training loop and the output directory."""

from fedpersonal.program.outputs import ExperimentOutputs
from fedpersonal.program.outputs import flatten_metrics
from fedpersonal.program.outputs import plot_curves
from fedpersonal.program.outputs import replace_marked_section
from fedpersonal.program.outputs import save_figure
from fedpersonal.program.outputs import write_json
from fedpersonal.program.seeds import mean_over_seeds
from fedpersonal.program.seeds import run_seeds
from fedpersonal.program.seeds import seed_output_dir
from fedpersonal.program.selection import EarlyStopping
from fedpersonal.program.selection import ModelSelection
from fedpersonal.program.training_loop import RUN_CONFIG_FILE
from fedpersonal.program.training_loop import ClientStatesLostError
from fedpersonal.program.training_loop import ConfigMismatchError
from fedpersonal.program.training_loop import flatten_private_state
from fedpersonal.program.training_loop import guard_config
from fedpersonal.program.training_loop import run_learning_process
from fedpersonal.program.training_loop import sample_clients
from fedpersonal.program.training_loop import unflatten_private_state
