"""Training: the loop (any task), the translation task, metrics, checkpoints with bit-exact
resume, and the recipes (toy, parallel text files, Multi30k)."""
from .averaging import average_checkpoints, average_state_dicts
from .checkpointing import load_model_checkpoint, save_model_checkpoint
from .early_stopping import EarlyStopping
from .metrics import corpus_bleu, exact_match, sacrebleu_scores
from .metrics_log import MetricsLog, read_metrics_log
from .task import Task
from .trainer import TrainConfig, Trainer
from .translation import TranslationTask, translation_trainer

__all__ = ["EarlyStopping", "MetricsLog", "Task", "TrainConfig", "Trainer", "TranslationTask",
           "average_checkpoints",
           "average_state_dicts", "corpus_bleu", "exact_match", "load_model_checkpoint",
           "read_metrics_log", "sacrebleu_scores", "save_model_checkpoint",
           "translation_trainer"]
