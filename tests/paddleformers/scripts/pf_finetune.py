"""A PaddleFormers fine-tuning script, as its users write one: arguments from the command line
(``PdArgumentParser`` over its ``TrainingArguments`` and the script's own), a causal LM of
``paddleformers.transformers`` (a tiny random Llama or ERNIE 4.5: no download), full or LoRA
(``paddleformers.peft``), ``Trainer(...).train()``, ``save_model()``. The tests run it as written
(PaddleFormers' Trainer) and with only the ``Trainer`` import changed (ours).

Every record its Trainer hands to ``on_log`` is written to ``<output_dir>/logs.json`` by a PaddleFormers
``TrainerCallback`` (its ``trainer_state.json`` keeps no log history), with ``train()``'s metrics and
the hooks seen.
"""

import json  # noqa: I001 - the Trainer import stays a line of its own (the one the tests change)
import os
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddleformers.trainer import PdArgumentParser, TrainerCallback, TrainingArguments
from paddleformers.trainer import Trainer


@dataclass
class ScriptArguments:
    model: str = field(default="llama", metadata={"help": "llama or ernie4_5"})
    lora: bool = field(default=False, metadata={"help": "train a LoRA adapter (paddleformers.peft)"})
    samples: int = field(default=40, metadata={"help": "training samples"})
    seq_len: int = field(default=16, metadata={"help": "tokens per sample"})
    model_seed: int = field(default=1, metadata={"help": "paddle.seed before the model is made"})
    dropout: float = field(default=0.0, metadata={"help": "ERNIE 4.5's hidden and attention dropout"})
    padded: bool = field(default=False, metadata={"help": "samples of different lengths, padded by its "
                                                          "DataCollatorForSeq2Seq with a tokenizer; an image "
                                                          "processor as processing_class (saved with the model)"})
    resume_from: str = field(default=None, metadata={"help": "train(resume_from_checkpoint=...)"})
    custom_resume: bool = field(default=False, metadata={"help": "a resume_from_custom_func that records its call"})
    eval_ragged: bool = field(default=False, metadata={"help": "an evaluation set of 10 samples whose labels are "
                                                                "-100 after a varying position; predict() on it"})


VOCAB = 64


def tiny_model(name: str, dropout: float = 0.0):
    """A 2-layer, 32-wide random causal LM (fuse_rms_norm off: this CPU build has no fused kernel)."""
    if name == "llama":
        from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                          fuse_rms_norm=False)
        return LlamaForCausalLM(cfg)
    if name == "ernie4_5":
        from paddleformers.transformers.ernie4_5.configuration import Ernie4_5Config
        from paddleformers.transformers.ernie4_5.modeling import Ernie4_5ForCausalLM

        cfg = Ernie4_5Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                             fuse_rms_norm=False, hidden_dropout_prob=dropout, attention_dropout_prob=dropout)
        return Ernie4_5ForCausalLM(cfg)
    raise SystemExit(f"--model must be llama or ernie4_5, got {name!r}")


class Tokens(paddle.io.Dataset):
    """Sequences of a repeating pattern with noise (learnable), labels = input ids (the model shifts them)."""

    def __init__(self, n: int, seq_len: int, seed: int = 0):
        rng = np.random.RandomState(seed)
        start = rng.randint(0, VOCAB, (n, 1))
        step = rng.randint(1, 4, (n, 1))
        x = (start + step * np.arange(seq_len)[None, :]) % VOCAB
        noise = rng.rand(n, seq_len) < 0.1
        self.x = np.where(noise, rng.randint(0, VOCAB, (n, seq_len)), x).astype("int64")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_tokenizer():
    """A word-level tokenizer of the vocabulary (w0, w1, ...; [PAD] = 0), made in memory: no download."""
    from paddleformers.transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class Ragged(Tokens):
    """The same sequences cut to 6..seq_len tokens (lists: the collator pads them)."""

    def __init__(self, n: int, seq_len: int, seed: int = 0):
        super().__init__(n, seq_len, seed)
        self.lengths = np.random.RandomState(seed + 1).randint(6, seq_len + 1, n)

    def __getitem__(self, i):
        ids = [int(t) for t in self.x[i][: self.lengths[i]]]
        return {"input_ids": ids, "labels": ids}


class RaggedLabels(Tokens):
    """Full-length inputs whose labels stop (-100) after 3..seq_len tokens: batches of different label counts."""

    def __init__(self, n: int, seq_len: int, seed: int = 5):
        super().__init__(n, seq_len, seed)
        keep = np.random.RandomState(seed + 1).randint(3, seq_len + 1, n)
        self.labels = np.where(np.arange(seq_len)[None, :] < keep[:, None], self.x, -100).astype("int64")

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.labels[i]}


class Record(TrainerCallback):
    """Every log record, and the hooks called, in order."""

    def __init__(self):
        self.logs, self.hooks, self.order = [], [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append({k: v for k, v in (logs or {}).items()})
        self.order.append(("on_log", state.global_step))

    def on_save(self, args, state, control, **kwargs):
        self.hooks.append(("on_save", state.global_step))
        self.order.append(("on_save", state.global_step))

    def on_save_hf(self, args, state, control, **kwargs):
        self.hooks.append(("on_save_hf", state.global_step))
        self.order.append(("on_save_hf", state.global_step))


def main():
    sargs, args = PdArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    paddle.seed(sargs.model_seed)
    model = tiny_model(sargs.model, sargs.dropout)
    if sargs.lora:
        from paddleformers.peft import LoRAConfig, LoRAModel

        lora = LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*", ".*up_proj.*"], r=4, lora_alpha=8)
        model = LoRAModel(model, lora)
        model.mark_only_lora_as_trainable()
    record = Record()
    extra = {}
    if sargs.padded:
        from paddleformers.data import DataCollatorForSeq2Seq
        from paddleformers.transformers import Qwen2VLImageProcessor

        tokenizer = tiny_tokenizer()
        extra = dict(tokenizer=tokenizer, data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
                     processing_class=Qwen2VLImageProcessor())
    if sargs.custom_resume:
        extra["resume_from_custom_func"] = lambda m: record.hooks.append(("resume_from_custom_func", type(m).__name__))
    data = (Ragged if sargs.padded else Tokens)(sargs.samples, sargs.seq_len)
    if sargs.eval_ragged:
        extra["eval_dataset"] = RaggedLabels(10, sargs.seq_len)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[record], **extra)
    out = trainer.train(resume_from_checkpoint=sargs.resume_from)
    predicted = {}
    if sargs.eval_ragged:
        labels = trainer.predict(extra["eval_dataset"]).label_ids
        predicted = {"labels_in_order": bool(np.array_equal(labels, extra["eval_dataset"].labels))}
    trainer.save_model()
    trainer.save_state()
    if trainer.is_world_process_zero():
        with open(os.path.join(args.output_dir, "logs.json"), "w", encoding="utf-8") as f:
            json.dump({"logs": record.logs, "hooks": record.hooks, "order": record.order, "global_step": out.global_step,
                       "training_loss": out.training_loss, "metrics": out.metrics, **predicted}, f, indent=1)


if __name__ == "__main__":
    main()
