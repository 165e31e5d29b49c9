"""Two more PaddleNLP script shapes, written for the tests in the style of PaddleNLP's examples:

- ``--shape qa``: extractive QA, AutoModelForQuestionAnswering (start and end logits, a tuple of
  two [batch, length] outputs whose length is each batch's own), labels ``start_positions`` and
  ``end_positions`` (``--label_names``), exact-match metrics from both logits;
- ``--shape multilabel``: a multi-label head trained by a ``Trainer`` subclass that overrides
  ``compute_loss`` (BCE with logits on multi-hot float labels), micro-F1.

The tests run it as it is (PaddleNLP's Trainer) and with the one line ``from paddlenlp.trainer
import Trainer`` changed to ``from trainer import Trainer``: with ``--do_train`` it trains, saves the
model and evaluates; without, it evaluates the model it is given. Rank 0 writes
``output_dir/summary.json`` and ``output_dir/predictions.npz`` (predictions and labels of dev).
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddlenlp.data import DataCollatorWithPadding
from paddlenlp.datasets import MapDataset
from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.trainer import Trainer
from paddlenlp.transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification, AutoTokenizer


@dataclass
class DataArguments:
    data_dir: str = field(metadata={"help": "directory with train.jsonl, dev.jsonl (chars, tags)"})
    shape: str = field(default="qa", metadata={"help": "qa | multilabel"})


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a saved ERNIE (save_pretrained directory)"})


class MultiLabelTrainer(Trainer):
    """A Trainer subclass with its own loss, as PaddleNLP's multi-label example writes it."""

    def compute_loss(self, model, inputs, return_outputs=False):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        logits = model(**inputs)
        loss = paddle.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        return (loss, {"logits": logits}) if return_outputs else loss  # PaddleNLP slices a bare tensor as (loss, ...)


def read(path):
    with open(path, encoding="utf-8") as f:
        return MapDataset([json.loads(line) for line in f])


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    paddle.set_device(training_args.device)
    paddle.seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)

    def encode(example):
        encoded = tokenizer(example["chars"], is_split_into_words=True, max_seq_len=64)
        return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"]}

    if data_args.shape == "qa":
        model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path)

        def convert(example):  # the answer: the first sentiment span ([CLS] shifts positions by one)
            tags = example["tags"]
            start = next(i for i, t in enumerate(tags) if t.startswith("B-"))
            end = start
            while end + 1 < len(tags) and tags[end + 1].startswith("I-"):
                end += 1
            return {**encode(example), "start_positions": start + 1, "end_positions": end + 1}

        def compute_metrics(p):
            start_logits, end_logits = p.predictions
            starts, ends = p.label_ids
            hit_start = np.argmax(start_logits, -1) == starts.reshape(-1)
            hit_end = np.argmax(end_logits, -1) == ends.reshape(-1)
            return {"start_accuracy": float(hit_start.mean()), "exact_match": float((hit_start & hit_end).mean())}

        trainer_cls = Trainer
    else:
        model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, num_classes=2)

        def convert(example):  # labels: [has a positive span, has a negative span]
            tags = example["tags"]
            multi_hot = [float(any(t.endswith("POS") for t in tags)), float(any(t.endswith("NEG") for t in tags))]
            return {**encode(example), "labels": np.asarray(multi_hot, "float32")}

        def compute_metrics(p):
            guess, truth = p.predictions > 0, p.label_ids > 0.5
            tp = int((guess & truth).sum())
            return {"micro_f1": 2 * tp / max(1, int(guess.sum()) + int(truth.sum())), "true_positives": tp}

        trainer_cls = MultiLabelTrainer

    train_ds = read(os.path.join(data_args.data_dir, "train.jsonl")).map(convert) if training_args.do_train else None
    dev_ds = read(os.path.join(data_args.data_dir, "dev.jsonl")).map(convert)
    trainer = trainer_cls(model=model, args=training_args, data_collator=DataCollatorWithPadding(tokenizer),
                          train_dataset=train_ds, eval_dataset=dev_ds, tokenizer=tokenizer,
                          compute_metrics=compute_metrics)
    summary = {}
    if training_args.do_train:
        train_result = trainer.train()
        trainer.save_model()
        summary.update(train_loss=train_result.training_loss, global_step=train_result.global_step)
    eval_metrics = trainer.evaluate()
    predictions, label_ids, _ = trainer.predict(dev_ds)
    summary["eval"] = {k: v for k, v in eval_metrics.items() if "runtime" not in k and "per_second" not in k}
    if trainer.is_world_process_zero():
        preds = predictions if isinstance(predictions, (tuple, list)) else (predictions,)
        labels = label_ids if isinstance(label_ids, (tuple, list)) else (label_ids,)
        np.savez(os.path.join(training_args.output_dir, "predictions.npz"),
                 **{f"pred{i}": p for i, p in enumerate(preds)}, **{f"label{i}": x for i, x in enumerate(labels)})
        with open(os.path.join(training_args.output_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
