"""``python -m trainer.sft train CONFIG.yaml``: ``paddleformers-cli train``'s SFT run on our Trainer
(``trainer.sft.workflow``)."""

import sys

from trainer.sft.workflow import main

sys.exit(main())
