"""Supervised fine-tuning: PaddleFormers' ``SFTTrainer`` on this project's loop.

Owns: ``sft_trainer`` (``SFTTrainer``: a ``trainer.Trainer`` that takes the arguments of
``paddleformers.cli.train.sft.sft_trainer.SFTTrainer`` and does what it adds over its Trainer:
the datasets formatted, tokenized and labelled, ``Seq2Seq`` collation by default, ``ppl`` in the
log records, arg-max predictions in evaluation) and ``workflow`` (``paddleformers-cli train
CONFIG.yaml``'s SFT run, PaddleFormers' own ``run_sft``, with this ``SFTTrainer`` in its place:
``python -m trainer.sft train CONFIG.yaml``).

A PaddleFormers script changes one line::

    from paddleformers.cli.train.sft.sft_trainer import SFTTrainer   # theirs
    from trainer.sft import SFTTrainer                                # ours

May import: ``trainer.trainer`` (the loop it extends), ``trainer.args`` (our arguments pass as they are),
``trainer.errors``; never the
launcher, the commands or models. Nothing here imports paddleformers until an SFT run
begins (it lives in its own environment: docs/how-to/sft.md).

Used by: PaddleFormers users' SFT scripts and ``python -m trainer.sft``.
"""


def __getattr__(name):
    if name == "SFTTrainer":
        from .sft_trainer import SFTTrainer

        return SFTTrainer
    raise AttributeError(f"module 'trainer.sft' has no attribute {name!r}")


__all__ = ["SFTTrainer"]
