"""``paddleformers-cli train CONFIG.yaml`` on this project's loop: the same YAML (or JSON, or
``--flag value`` arguments), read by PaddleFormers' own parser and run by its own ``run_sft``
(``paddleformers.cli.train.sft.workflow``: the model from ``model_name_or_path``, LoRA, the packed
datasets of ``create_dataset``, the collator, the callbacks, resume, ``save_model``), with
``trainer.sft.SFTTrainer`` built where it builds its own.

    python -m trainer.sft train CONFIG.yaml [key=value ...]          # one process
    python -m paddle.distributed.launch --nproc_per_node 2 \\
        $(python -c "import trainer.sft.workflow as w; print(w.__file__)") train CONFIG.yaml

``paddleformers-cli`` itself starts paddle's launcher on its ``launcher.py`` (GPUs, XPUs or NPUs
named by ``CUDA_VISIBLE_DEVICES`` and the like); the second line is that launch, on this
module. Only the SFT stages (``SFT``, ``PT``) are taken here: any other ``stage`` is refused in one
line before anything is built.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

STAGES = ("SFT", "PT")  # run_sft's text stages; VL-*, DPO and the pretraining stages have trainers of their own


def run(argv: Sequence[str]) -> None:
    """``argv`` as ``paddleformers-cli`` takes it after its command: ``CONFIG.yaml [key=value ...]``."""
    from paddleformers.cli.hparams import read_args
    from paddleformers.cli.train.sft import workflow as theirs
    from paddleformers.cli.train.tuner import run_tuner

    from trainer.errors import (
        ConfigError,  # absolute: paddle's launcher runs this file as a script
    )
    from trainer.sft.sft_trainer import SFTTrainer

    saved = sys.argv
    sys.argv = ["paddleformers-cli", "train", *argv]  # their reader reads the config's path from sys.argv[2]
    try:
        args = read_args()
    finally:
        sys.argv = saved
    stage = args.get("stage", "SFT") if isinstance(args, dict) else _flag(args, "--stage", "SFT")
    if stage not in STAGES:
        raise ConfigError(f"stage: {stage!r} is not run on this trainer (only {', '.join(STAGES)}): "
                          "run it with paddleformers-cli")
    theirs.SFTTrainer = SFTTrainer  # the one name run_sft builds its trainer from
    run_tuner(args)


def _flag(argv: Sequence[str], name: str, default: str) -> str:
    argv = list(argv)
    return argv[argv.index(name) + 1] if name in argv[:-1] else default


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train" or len(argv) < 2:
        print("usage: python -m trainer.sft train CONFIG.yaml [key=value ...]  (paddleformers-cli train's arguments)",
              file=sys.stderr)
        return 2
    from trainer.errors import ConfigError

    try:
        run(argv[1:])
    except ConfigError as e:  # a config this trainer cannot run: one line, exit 2
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
