"""A PaddleNLP Trainer script with tensor parallel, in the style of PaddleNLP's llm examples: the model config
takes ``tensor_parallel_degree`` / ``tensor_parallel_rank`` from the TrainingArguments (whose construction set
up fleet's topology), a small Llama with random weights trains on random tokens.

The tests run it with ``from paddlenlp.trainer import Trainer`` changed to ``from trainer import Trainer`` under
2 processes with ``--tensor_parallel_degree 2``, and as one process; PaddleNLP's own Trainer stops on CPU at
fleet's input broadcast (it asserts a GPU). ``output_dir/summary.json`` holds the logged losses.
"""

import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.trainer import Trainer
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class ModelArguments:
    hidden_size: int = field(default=32, metadata={"help": "hidden size"})
    vocab_size: int = field(default=64, metadata={"help": "vocabulary"})


class Tokens(paddle.io.Dataset):
    def __init__(self, n, length, vocab):
        rng = np.random.RandomState(1)
        self.ids = rng.randint(1, vocab, size=(n, length)).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i][:-1], "labels": self.ids[i][1:]}


def main():
    model_args, training_args = PdArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = LlamaConfig(vocab_size=model_args.vocab_size, hidden_size=model_args.hidden_size, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=64, tensor_parallel_output=False, use_flash_attention=False)
    config.tensor_parallel_degree = training_args.tensor_parallel_degree
    config.tensor_parallel_rank = training_args.tensor_parallel_rank
    paddle.seed(training_args.seed)
    model = LlamaForCausalLM(config)
    whole = np.load(os.environ["TP_WEIGHTS"])  # the same whole weights for every layout (the test writes them)
    rank, degree = max(training_args.tensor_parallel_rank, 0), max(training_args.tensor_parallel_degree, 1)
    state = {}
    for name, p in model.state_dict().items():
        value = whole[name]
        for axis in range(value.ndim):
            if value.shape[axis] != p.shape[axis]:  # this rank's block of a split parameter
                size = value.shape[axis] // degree
                value = np.take(value, range(rank * size, (rank + 1) * size), axis=axis)
        state[name] = paddle.to_tensor(value.astype("float32"))
    model.set_state_dict(state)
    trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(64, 13, model_args.vocab_size))
    trainer.train()
    if training_args.process_index == 0 or "PADDLE_TRAINER_ID" not in os.environ:
        with open(os.path.join(training_args.output_dir, f"summary-{os.environ.get('PADDLE_TRAINER_ID', 0)}.json"), "w") as f:
            json.dump({"losses": [r["loss"] for r in trainer.state.log_history if "loss" in r]}, f)


if __name__ == "__main__":
    sys.exit(main())
