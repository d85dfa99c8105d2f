"""Training: the loop, metrics, checkpoints with bit-exact resume, and the two recipes (toy and
Multi30k)."""
from .averaging import average_checkpoints, average_state_dicts
from .checkpointing import load_model_checkpoint, save_model_checkpoint
from .early_stopping import EarlyStopping
from .metrics import MetricsLog, corpus_bleu, exact_match, read_metrics_log, sacrebleu_scores
from .trainer import TrainConfig, Trainer

__all__ = ["EarlyStopping", "MetricsLog", "TrainConfig", "Trainer", "average_checkpoints",
           "average_state_dicts", "corpus_bleu", "exact_match", "load_model_checkpoint",
           "read_metrics_log", "sacrebleu_scores", "save_model_checkpoint"]
