"""Execution runtime: TFF context setup and the C++ worker's lifetime."""

from fedpersonal.runtime.distributed import DistributedRuntime
from fedpersonal.runtime.distributed import for_workers
from fedpersonal.runtime.execution_context import LocalRuntime
from fedpersonal.runtime.execution_context import install_worker_tracking
from fedpersonal.runtime.execution_context import running_workers
from fedpersonal.runtime.execution_context import shutdown
from fedpersonal.runtime.execution_context import worker_pids_of_this_process
