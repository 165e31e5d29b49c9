"""Under paddle.distributed.launch: record the launcher's environment and the device the trainer picks."""

import json
import logging
import os
import sys

logging.basicConfig(level=logging.WARNING)  # as ptrain configures ranks other than 0

from trainer import distributed as dist  # noqa: E402

out_dir, device = sys.argv[1], sys.argv[2]
env = {k: v for k, v in os.environ.items() if k.startswith(("PADDLE_", "FLAGS_", "CUDA_"))}
place = dist.select_device(device)
with open(os.path.join(out_dir, f"env.{dist.get_rank()}.json"), "w") as f:
    json.dump({"env": env, "place": place}, f)
