"""Two ranks train like one process on the same global batch: sharding stages 2 and 3 (paddle's
group_sharded_parallel, through the test-only CPU shim), each plain, with recompute, and with gradient
accumulation plus clipping by the global norm (tests/parallel/parity.py)."""

import pytest
from parallel.parity import VARIANTS, check_two_ranks


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", ["stage2", "stage3"])
def test_two_ranks_train_like_one_process(mode, variant, reference, tmp_path):
    check_two_ranks(mode, variant, reference(variant), tmp_path)
