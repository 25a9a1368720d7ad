"""fedpersonal: personalized, partially local federated learning on TensorFlow Federated.

The package's modules are its public API, imported on first use (so `import fedpersonal` is cheap and changes
nothing in TensorFlow or TFF):

* `fedpersonal.core`: the process protocol, the composer and the client-work library every algorithm uses;
* `fedpersonal.algorithms`: one `build_*` per method (FedRecon, FURL, Ditto, FedDVA, HPFL and baselines);
* `fedpersonal.evaluation`: ReconEval, StandardEval, evaluation with stored private states;
* `fedpersonal.baselines`: the centralized (server-side) training baselines;
* `fedpersonal.tff_compat`: TFF 0.87's `build_fed_recon` / `build_fed_recon_eval`, signatures and return types;
* `fedpersonal.models`: the partially local Keras wrapper and the papers' models;
* `fedpersonal.data`, `fedpersonal.metrics`, `fedpersonal.client_state`, `fedpersonal.privacy`;
* `fedpersonal.program`: the training loop and output directory shared by every binary;
* `fedpersonal.runtime`: TFF's execution context and the lifetime of its C++ workers (`LocalRuntime`).

Importing the package adds one import hook (`fedpersonal.quiet`): the first import of TensorFlow after it leaves
out TensorFlow's known start-up lines (CUDA/cuDNN not found, CPU instructions; every other line is kept), and TFF's
default context is released at exit. ``FEDPERSONAL_VERBOSE_TF=1`` filters nothing.

Example:

>>> import fedpersonal
>>> sorted(fedpersonal.__all__)[:3]
['algorithms', 'baselines', 'client_state']
"""

from __future__ import annotations

import importlib
from typing import Any

from fedpersonal import quiet as _quiet

__version__ = '0.1.0'

__all__ = [
    'algorithms',
    'baselines',
    'client_state',
    'core',
    'data',
    'evaluation',
    'metrics',
    'models',
    'privacy',
    'program',
    'runtime',
    'tasks',
]


_quiet.install()


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f'{__name__}.{name}')
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
