"""Models: the partially local Keras wrapper and the papers' models."""

from fedpersonal.models.furl_models import BinaryAUC
from fedpersonal.models.furl_models import furl_model_fn
from fedpersonal.models.partially_local_model import DatasetSpecError
from fedpersonal.models.partially_local_model import FnArgumentError
from fedpersonal.models.partially_local_model import ModelSpecError
from fedpersonal.models.partially_local_model import PartiallyLocalModel
from fedpersonal.models.partially_local_model import check_dataset_matches
from fedpersonal.models.partially_local_model import check_loss_and_metrics_fns
from fedpersonal.models.partially_local_model import from_keras_model
from fedpersonal.models.partially_local_model import require_parts
