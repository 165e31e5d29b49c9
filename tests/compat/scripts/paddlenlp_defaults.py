"""PaddleNLP's own Trainer with its defaults, its default ``report_to`` (VisualDL) included: the "before" run of
every migration (docs/how-to/migrate-paddlenlp.md). Usage: python paddlenlp_defaults.py OUTPUT_DIR"""
import sys
import numpy as np
import paddle
from paddlenlp.trainer import Trainer, TrainingArguments


class Data(paddle.io.Dataset):
    def __init__(self, n=32):
        rng = np.random.RandomState(0)
        self.x = rng.randn(n, 4).astype("float32")
        self.y = (self.x.sum(1) > 0).astype("int64")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Model(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 2)

    def forward(self, x, labels=None):
        logits = self.fc(x)
        loss = paddle.nn.functional.cross_entropy(logits, labels)
        return loss, logits


args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, logging_steps=1)  # every other field: PaddleNLP's default
print("report_to", args.report_to)
out = Trainer(model=Model(), args=args, train_dataset=Data()).train()
print("TRAINED", out.global_step)
