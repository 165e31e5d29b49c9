"""A PaddleNLP GLUE-style fine-tuning script, written for the parity tests:
PdArgumentParser, ``set_seed`` before the model, a tokenizer-padded
collator, ``train`` / ``evaluate`` / ``save_state``. Nothing here is chosen
to suit either trainer: ERNIE keeps its dropout, the arguments keep
PaddleNLP's defaults except those given on the command line.

The tests run it as it is (PaddleNLP's Trainer) and with the one line
``from paddlenlp.trainer import Trainer`` changed to ``from trainer import
Trainer``, and compare every record of ``trainer_state.json``'s log history.
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddlenlp.data import DataCollatorWithPadding
from paddlenlp.datasets import MapDataset
from paddlenlp.trainer import PdArgumentParser, TrainingArguments, set_seed
from paddlenlp.trainer import Trainer
from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer


@dataclass
class DataArguments:
    data_dir: str = field(metadata={"help": "directory with train.jsonl and dev.jsonl"})
    max_seq_length: int = field(default=32, metadata={"help": "maximum tokens per sentence"})


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a saved ERNIE (save_pretrained directory)"})


def read(path):
    with open(path, encoding="utf-8") as f:
        return MapDataset([json.loads(line) for line in f])


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, num_classes=2)

    def convert(example):
        encoded = tokenizer(example["sentence"], max_seq_len=data_args.max_seq_length)
        return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"],
                "labels": example["label"]}

    train_ds = read(os.path.join(data_args.data_dir, "train.jsonl")).map(convert)
    dev_ds = read(os.path.join(data_args.data_dir, "dev.jsonl")).map(convert)

    def compute_metrics(p):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        return {"accuracy": float((np.argmax(preds, axis=-1) == p.label_ids.reshape(-1)).mean())}

    trainer = Trainer(model=model, args=training_args, data_collator=DataCollatorWithPadding(tokenizer),
                      train_dataset=train_ds, eval_dataset=dev_ds, tokenizer=tokenizer,
                      compute_metrics=compute_metrics)
    result = trainer.train()
    metrics = trainer.evaluate()
    trainer.save_state()
    if trainer.is_world_process_zero():
        with open(os.path.join(training_args.output_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump({"train_loss": result.training_loss, "global_step": result.global_step, "eval": metrics,
                       "world_size": training_args.world_size}, f, indent=1)


if __name__ == "__main__":
    main()
