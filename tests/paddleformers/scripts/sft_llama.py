"""A PaddleFormers 1.2 SFT script, as a user writes one after ``paddleformers-cli train``'s ``run_sft``: a chat
dataset read by ``paddleformers.datasets.create_dataset`` (packed: greedy intokens or bin packing), batched by
``paddleformers.datasets.collate_fn``, a tiny random Llama (LoRA with ``--lora``), trained by ``SFTTrainer`` from
an ``SFTConfig``.

    python sft_llama.py theirs OUT [--lora] [--packing greedy|binpacking|none]   # PaddleFormers' SFTTrainer
    python sft_llama.py ours OUT ...                                                # ours: the one import changed

On rank 0 the last line is ``RESULT <json>``: the log records (step, loss, learning_rate) and the train metrics.
Run it on 2 processes with ``python -m paddle.distributed.launch --nproc_per_node 2 sft_llama.py ...``.
"""

import argparse
import json
import os
from functools import partial

import paddle

p = argparse.ArgumentParser()
p.add_argument("which", choices=["theirs", "ours"])
p.add_argument("out")
p.add_argument("--lora", action="store_true")
p.add_argument("--packing", default="greedy", choices=["greedy", "binpacking", "none"])
p.add_argument("--steps", type=int, default=6)
p.add_argument("--batch", type=int, default=2)
p.add_argument("--accumulate", type=int, default=1)
p.add_argument("--eval", action="store_true", help="evaluate every 3 steps on a second chat file")
cli = p.parse_args()

if cli.which == "theirs":
    from paddleformers.cli.train.sft.sft_trainer import SFTTrainer
else:
    from trainer.sft import SFTTrainer

from paddleformers.cli.train.sft.sft_config import SFTConfig  # noqa: E402
from paddleformers.datasets import collate_fn, create_dataset  # noqa: E402
from paddleformers.peft import LoRAConfig, LoRAModel  # noqa: E402
from paddleformers.trainer import TrainerCallback  # noqa: E402
from paddleformers.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from sft_data import make_tokenizer, write_chats  # noqa: E402

rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
os.makedirs(cli.out, exist_ok=True)
work = os.path.join(cli.out, f"inputs_rank{rank}")  # each rank its own copy: no rank waits for another's files
tokenizer = AutoTokenizer.from_pretrained(make_tokenizer(os.path.join(work, "tokenizer")))
train_file = write_chats(os.path.join(work, "train.jsonl"), n=48, seed=0)
eval_file = write_chats(os.path.join(work, "eval.jsonl"), n=8, seed=1)

MAX_SEQ_LEN = 128
args = SFTConfig(output_dir=os.path.join(cli.out, "run"), per_device_train_batch_size=cli.batch,
                 per_device_eval_batch_size=cli.batch, gradient_accumulation_steps=cli.accumulate,
                 max_steps=cli.steps, logging_steps=1, learning_rate=1e-3, warmup_steps=2, max_seq_len=MAX_SEQ_LEN,
                 amp_master_grad=False, sharding="", save_strategy="no", report_to=[], disable_tqdm=True, seed=7,
                 do_train=True, do_eval=cli.eval, evaluation_strategy="steps" if cli.eval else "no", eval_steps=3)

paddle.seed(1)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=MAX_SEQ_LEN, fuse_rms_norm=False)
model = LlamaForCausalLM(config)
if cli.lora:
    model = LoRAModel(model, LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8,
                                        merge_weights=False))
    model.mark_only_lora_as_trainable()


class ModelArgs:  # the fields of run_sft's ModelArguments that collate_fn reads
    use_attn_mask_startend_row_indices = False  # flash attention's row indices need a GPU: a dense mask here
    use_global_causal_attn = False


packing = cli.packing != "none"
dataset_config = dict(tokenizer=tokenizer, max_seq_len=MAX_SEQ_LEN, random_seed=args.seed,
                      num_replicas=args.dataset_world_size, rank=args.dataset_rank, random_shuffle=True,
                      greedy_intokens=cli.packing == "greedy", packing=packing, binpacking=cli.packing == "binpacking",
                      packing_interval=16, mix_strategy="concat", encode_one_turn=True, use_template=True,
                      stage="SFT", template_backend="jinja", truncation_strategy="delete", dataset_type="iterable",
                      num_samples_each_epoch=6000000, dataset_num_proc=1)
train_dataset = create_dataset(task_group=train_file, task_group_prob="1.0", sub_dataset_type="messages",
                               **dataset_config)
eval_dataset = (create_dataset(task_group=eval_file, task_group_prob="1.0", sub_dataset_type="messages",
                               is_valid=True, **dataset_config) if cli.eval else None)
data_collator = partial(collate_fn, tokenizer=tokenizer, training_args=args, model_args=ModelArgs(),
                        max_seq_len=MAX_SEQ_LEN if packing else None, padding_free=False)



class Records(TrainerCallback):
    """The log records as PaddleFormers' callbacks see them (its trainer_state.json's log_history stays empty)."""

    def __init__(self):
        self.records = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        keys = ("loss", "learning_rate", "ppl", "eval_loss", "eval_ppl")
        self.records.append({"step": state.global_step, **{k: logs[k] for k in keys if k in logs}})


records = Records()
trainer = SFTTrainer(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                     tokenizer=tokenizer, data_collator=data_collator, callbacks=[records])
out = trainer.train()
if rank == 0:
    records = [r for r in records.records if len(r) > 1]
    if not records:  # no PaddleFormers callback adapter: the records of our log_history (theirs is always empty)
        keys = ("loss", "learning_rate", "ppl", "eval_loss", "eval_ppl")
        records = [{"step": r["step"], **{k: r[k] for k in keys if k in r}} for r in trainer.state.log_history
                   if any(k in r for k in keys)]
    print("RESULT " + json.dumps({"records": records, "metrics": {k: v for k, v in out.metrics.items()
                                                                   if k in ("train_loss", "train_ppl")}},
                                 default=float), flush=True)
