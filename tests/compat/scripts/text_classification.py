"""A PaddleNLP Trainer script, written for the tests in the style of
PaddleNLP's text-classification examples: PdArgumentParser,
DataCollatorWithPadding, EarlyStoppingCallback, do_train / do_eval /
do_predict / do_export, train / save_model / log_metrics / save_metrics.

The tests run it as it is (PaddleNLP's Trainer) and with the one line
``from paddlenlp.trainer import Trainer`` changed to ``from trainer import
Trainer`` (this project's). A recording callback writes the order of its hook
calls to ``output_dir/events.json``; ``output_dir/summary.json`` holds the
metrics.
"""

import json
import os
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddle.static import InputSpec
from paddlenlp.data import DataCollatorWithPadding
from paddlenlp.datasets import MapDataset
from paddlenlp.trainer import EarlyStoppingCallback, PdArgumentParser, TrainerCallback, TrainingArguments
from paddlenlp.trainer import Trainer
from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer, export_model

HOOKS = ("on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
         "on_substep_end", "on_optimizer_begin", "on_optimizer_end", "on_step_end", "on_evaluate", "on_save",
         "on_log", "on_prediction_step")


@dataclass
class DataArguments:
    data_dir: str = field(metadata={"help": "directory with train.jsonl, dev.jsonl, test.jsonl"})
    max_seq_length: int = field(default=32, metadata={"help": "maximum tokens per sentence"})
    early_stopping_patience: int = field(default=2, metadata={"help": "evaluations without improvement that stop training"})


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "a saved ERNIE (save_pretrained directory)"})


class RecordEvents(TrainerCallback):
    """Records the hooks called, in order (with the global step), as PaddleNLP's own event-flow test does."""

    def __init__(self):
        self.events = []
        for hook in HOOKS:
            setattr(self, hook, self._recorder(hook))

    def _recorder(self, hook):
        def record(args, state, control, **kwargs):
            self.events.append(hook)
        return record


def read(path):
    with open(path, encoding="utf-8") as f:
        return MapDataset([json.loads(line) for line in f])


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    training_args.print_config(model_args, "Model")
    training_args.print_config(data_args, "Data")
    paddle.set_device(training_args.device)
    paddle.seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, num_classes=2)

    def convert(example):
        encoded = tokenizer(example["sentence"], max_seq_len=data_args.max_seq_length)
        return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"],
                "labels": example["label"]}

    train_ds = read(os.path.join(data_args.data_dir, "train.jsonl")).map(convert)
    dev_ds = read(os.path.join(data_args.data_dir, "dev.jsonl")).map(convert)
    test_ds = read(os.path.join(data_args.data_dir, "test.jsonl")).map(convert)

    def compute_metrics(p):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        return {"accuracy": float((np.argmax(preds, axis=-1) == p.label_ids.reshape(-1)).mean())}

    recorder = RecordEvents()
    trainer = Trainer(
        model=model,
        args=training_args,
        data_collator=DataCollatorWithPadding(tokenizer),
        train_dataset=train_ds if training_args.do_train else None,
        eval_dataset=dev_ds if training_args.do_eval else None,
        tokenizer=tokenizer,
        compute_metrics=compute_metrics,
        callbacks=[EarlyStoppingCallback(early_stopping_patience=data_args.early_stopping_patience), recorder],
    )
    summary = {"world_size": training_args.world_size, "process_index": training_args.process_index}

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics = train_result.metrics
        trainer.save_model()
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        summary["train_loss"] = train_result.training_loss
        summary["global_step"] = train_result.global_step

    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        summary["eval_accuracy"] = eval_metrics["eval_accuracy"]

    if training_args.do_predict:
        predictions, label_ids, test_metrics = trainer.predict(test_ds)
        trainer.log_metrics("test", test_metrics)
        summary["test_accuracy"] = float((np.argmax(predictions, axis=-1) == label_ids.reshape(-1)).mean())

    if training_args.do_export:
        input_spec = [InputSpec(shape=[None, None], dtype="int64", name="input_ids"),
                      InputSpec(shape=[None, None], dtype="int64", name="token_type_ids")]
        export_model(model=trainer.model, input_spec=input_spec, path=os.path.join(training_args.output_dir, "export"))

    summary["events"] = recorder.events
    if trainer.is_world_process_zero():
        with open(os.path.join(training_args.output_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
