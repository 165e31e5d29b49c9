"""A PaddleNLP token-classification script, written for the tests in the style of
PaddleNLP's NER examples: PdArgumentParser, AutoModelForTokenClassification,
DataCollatorForTokenClassification (each batch padded to its own longest
sequence, labels padded with -100), seqeval metrics, train / evaluate / predict.

The tests run it as it is (PaddleNLP's Trainer) and with the one line
``from paddlenlp.trainer import Trainer`` changed to ``from trainer import
Trainer`` (this project's), on one process and under
``python -m paddle.distributed.launch --nproc_per_node 2``. Rank 0 writes
``output_dir/summary.json`` (metrics) and ``output_dir/predictions.npz``
(predictions and label_ids of the test split).
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddlenlp.data import DataCollatorForTokenClassification
from paddlenlp.datasets import MapDataset
from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.trainer import Trainer
from paddlenlp.transformers import AutoModelForTokenClassification, AutoTokenizer
from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

LABELS = ["O", "B-POS", "I-POS", "B-NEG", "I-NEG"]


@dataclass
class DataArguments:
    data_dir: str = field(metadata={"help": "directory with train.jsonl, dev.jsonl, test.jsonl (chars, tags)"})
    max_seq_length: int = field(default=64, metadata={"help": "maximum tokens per sentence"})


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
    paddle.seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForTokenClassification.from_pretrained(model_args.model_name_or_path, num_classes=len(LABELS))

    def convert(example):
        encoded = tokenizer(example["chars"], is_split_into_words=True, max_seq_len=data_args.max_seq_length)
        tags = [LABELS.index(t) for t in example["tags"]][: len(encoded["input_ids"]) - 2]
        return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"],
                "labels": [-100] + tags + [-100]}  # [CLS] and [SEP] carry no tag

    train_ds = read(os.path.join(data_args.data_dir, "train.jsonl")).map(convert)
    dev_ds = read(os.path.join(data_args.data_dir, "dev.jsonl")).map(convert)
    test_ds = read(os.path.join(data_args.data_dir, "test.jsonl")).map(convert)

    def compute_metrics(p):
        preds = np.argmax(p.predictions, axis=-1)
        kept = [[(LABELS[t], LABELS[q]) for t, q in zip(row, pred) if t != -100] for row, pred in zip(p.label_ids, preds)]
        truth = [[t for t, _ in row] for row in kept]
        guess = [[q for _, q in row] for row in kept]
        return {"precision": precision_score(truth, guess), "recall": recall_score(truth, guess),
                "f1": f1_score(truth, guess), "accuracy": accuracy_score(truth, guess),
                "tagged_tokens": int(sum(len(row) for row in kept))}

    trainer = Trainer(
        model=model,
        args=training_args,
        data_collator=DataCollatorForTokenClassification(tokenizer),
        train_dataset=train_ds if training_args.do_train else None,
        eval_dataset=dev_ds if training_args.do_eval else None,
        tokenizer=tokenizer,
        compute_metrics=compute_metrics,
    )
    summary = {"world_size": training_args.world_size}

    if training_args.do_train:
        train_result = trainer.train()
        trainer.save_model()
        summary["train_loss"] = train_result.training_loss
        summary["global_step"] = train_result.global_step
        summary["train_metrics"] = sorted(train_result.metrics)

    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        summary["eval"] = {k: v for k, v in eval_metrics.items() if "runtime" not in k and "per_second" not in k}
        summary["eval_keys"] = sorted(eval_metrics)
        summary["eval_types"] = {k: type(v).__name__ for k, v in eval_metrics.items()}

    if training_args.do_predict:
        predictions, label_ids, test_metrics = trainer.predict(test_ds)
        summary["test"] = {k: v for k, v in test_metrics.items() if "runtime" not in k and "per_second" not in k}
        if trainer.is_world_process_zero():
            np.savez(os.path.join(training_args.output_dir, "predictions.npz"), predictions=predictions,
                     label_ids=label_ids)

    if trainer.is_world_process_zero():
        os.makedirs(training_args.output_dir, exist_ok=True)
        with open(os.path.join(training_args.output_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
