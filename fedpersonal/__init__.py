"""fedpersonal: personalized, partially local federated learning on TensorFlow Federated.

Importing the package makes every TFF C++ worker it (or TFF) starts tracked and
bound to this process, so no `worker_binary` outlives a run (see
`fedpersonal.runtime`).
"""

from fedpersonal.runtime import execution_context as _execution_context

_execution_context.install_worker_tracking()

__version__ = '0.1.0'
