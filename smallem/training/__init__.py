"""What a run is and how it goes: the registry of models, the config (every default once), the
step (plain, or captured once as a CUDA graph and replayed), the loop with its evaluations and
its health monitor, sampling, checkpoints (written through smallem.files), and the three
checks. It uses nn, optim, data and models."""

from .checkpoint import load_checkpoint, save_checkpoint
from .checks import check_backends_agree, check_initial_loss, check_overfit, run_checks
from .config import TrainConfig, build_model
from .evaluation import evaluate
from .generate import load_model, sample
from .loop import TrainResult, train
from .step import CapturedStep, loss_and_gradients, make_step, train_step

__all__ = [
    "TrainConfig", "build_model", "train", "evaluate", "TrainResult", "sample", "load_model",
    "train_step", "loss_and_gradients", "make_step", "CapturedStep", "save_checkpoint",
    "load_checkpoint", "check_initial_loss", "check_overfit", "check_backends_agree", "run_checks",
]
