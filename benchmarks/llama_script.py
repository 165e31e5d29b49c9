"""A PaddleNLP Trainer script as PaddleNLP's users write it: a random-init ``LlamaForCausalLM`` trains on random
tokens through ``paddlenlp.trainer.Trainer``. ``benchmarks/memory --against-paddlenlp`` runs it as written and with
the one line ``from paddlenlp.trainer import Trainer`` changed to ``from trainer import Trainer`` (the
environment variable ``LLAMA_SCRIPT_TRAINER=ours``), under ``paddle.distributed.launch``, and compares the ranks.

What the benchmark reads is written by a ``TrainerCallback`` (PaddleNLP's: ours takes it at the door) into
``output_dir/measure-rank{N}.json``: the peak resident set (``ru_maxrss``), the peak address space (``VmPeak``), the
CPU time of each step (``time.process_time``) and the logged losses. The parent wraps each rank in ``prlimit --as``
when it looks for the largest model.
"""

import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import paddle
from paddlenlp.trainer import PdArgumentParser, TrainerCallback, TrainingArguments
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

if os.environ.get("LLAMA_SCRIPT_TRAINER") == "ours":
    from trainer import Trainer
else:
    from paddlenlp.trainer import Trainer


@dataclass
class ModelArguments:
    hidden_size: int = field(default=512, metadata={"help": "hidden size"})
    num_hidden_layers: int = field(default=10, metadata={"help": "decoder layers"})
    num_attention_heads: int = field(default=8, metadata={"help": "attention heads"})
    intermediate_size: int = field(default=1376, metadata={"help": "feed-forward size"})
    vocab_size: int = field(default=8000, metadata={"help": "vocabulary"})
    seq_length: int = field(default=128, metadata={"help": "tokens a sample"})


class Tokens(paddle.io.Dataset):
    def __init__(self, n, length, vocab):
        self.ids = np.random.RandomState(1).randint(1, vocab, size=(n, length + 1)).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i][:-1], "labels": self.ids[i][1:]}


def vm_peak_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) / 1024
    return 0.0


def mallinfo() -> dict:
    """glibc's heap: bytes the arenas hold, the free bytes and chunks among them, bytes in mmapped chunks."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Mallinfo2
    except (OSError, AttributeError):
        return {}
    info = libc.mallinfo2()
    return {"arena_mb": info.arena / 2**20, "free_mb": info.fordblks / 2**20, "free_chunks": info.ordblks,
            "mmapped_mb": info.hblkhd / 2**20}


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def trace_mark():
    """``benchmarks/malloc_trace.c``'s mark under ``benchmarks/malloc_trace.py`` (LD_PRELOAD), else a no-op."""
    if not os.environ.get("MALLOC_TRACE_OUT"):
        return lambda label: None
    import ctypes

    mark = ctypes.CDLL(None).malloc_trace_mark
    mark.argtypes = [ctypes.c_char_p]
    return lambda label: mark(label.encode())


class Measure(TrainerCallback):
    def __init__(self, path):
        self.path, self.cpu, self.rss = path, [], []
        self._start = time.process_time()
        self.begin = {}
        self.mark = trace_mark()

    def on_train_begin(self, args, state, control, **kwargs):
        import threading

        self.begin = {"rss_mb": rss_mb(), "vm_mb": vm_peak_mb(), "threads": [t.name for t in threading.enumerate()],
                      **mallinfo()}

    def on_step_begin(self, args, state, control, **kwargs):
        self.mark(f"before step {state.global_step + 1}")  # the logging and callbacks after the last step end here
        self._start = time.process_time()

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.mark(f"forward, backward, gradient sync {state.global_step + 1}")

    def on_optimizer_end(self, args, state, control, **kwargs):
        self.mark(f"clip, optimizer step, clear_grad {state.global_step + 1}")

    def on_step_end(self, args, state, control, **kwargs):
        self.cpu.append(time.process_time() - self._start)
        self.rss.append(rss_mb())

    def on_train_end(self, args, state, control, **kwargs):
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       "peak_vm_mb": vm_peak_mb(), "begin": self.begin, "end": mallinfo(),
                       "step_cpu_s": self.cpu, "rss_mb": self.rss,
                       "losses": [r["loss"] for r in state.log_history if "loss" in r]}, f)


def main():
    model_args, training_args = PdArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = LlamaConfig(vocab_size=model_args.vocab_size, hidden_size=model_args.hidden_size,
                         intermediate_size=model_args.intermediate_size,
                         num_hidden_layers=model_args.num_hidden_layers,
                         num_attention_heads=model_args.num_attention_heads,
                         num_key_value_heads=model_args.num_attention_heads,
                         max_position_embeddings=model_args.seq_length, use_flash_attention=False,
                         recompute=training_args.recompute)
    paddle.seed(training_args.seed)
    model = LlamaForCausalLM(config)
    world = max(training_args.world_size, 1)
    data = Tokens(training_args.per_device_train_batch_size * world * max(training_args.max_steps, 1),
                  model_args.seq_length, model_args.vocab_size)
    rank = max(training_args.process_index, 0)
    measure = Measure(os.path.join(training_args.output_dir, f"measure-rank{rank}.json"))
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[measure])
    trainer.train()


if __name__ == "__main__":
    sys.exit(main())
