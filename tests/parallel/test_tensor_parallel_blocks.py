"""The checkpoint blocks of tensor parallel, in one process: what each rank of a group writes of a split parameter
and its moments (trainer.layout.slices.block_specs), put together by the sharded format's index
(trainer.checkpoint.shards), and cut again for any degree (local_blocks)."""

import numpy as np
import paddle
import pytest

from trainer.checkpoint.shards import assemble, holdings, plan, shard_file
from trainer.layout import Layout
from trainer.layout.slices import block_specs, local_blocks, tensor_parallel_splits


def split_model():
    """Plain layers marked the way fleet's parallel layers mark theirs (is_distributed, split_axis)."""
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 6), paddle.nn.Linear(6, 4))
    for param, axis in ((model[0].weight, 1), (model[0].bias, 0), (model[1].weight, 0)):
        param.is_distributed, param.split_axis = True, axis
    return model


def whole_state(seed=0):
    rng = np.random.RandomState(seed)
    model = {"0.weight": rng.randn(4, 6), "0.bias": rng.randn(6), "1.weight": rng.randn(6, 4), "1.bias": rng.randn(4)}
    opt = {f"param:{k}_moment1_0": v * 0.1 for k, v in model.items()}
    opt.update({f"param:{k}_beta1_pow_acc_0": np.array([0.9]) for k in model})
    return model, opt


def test_blocks_of_two_ranks_put_together_and_cut_again():
    splits = tensor_parallel_splits(split_model())
    assert splits == {"0.weight": 1, "0.bias": 0, "1.weight": 0}
    model, opt = whole_state()
    held, specs, files = [], [], {}
    for rank in range(2):
        m, o = dict(model), dict(opt)
        local_blocks(splits, rank, 2, m, o)
        assert m["0.weight"].shape == (4, 3) and m["1.weight"].shape == (3, 4) and m["1.bias"].shape == (4,)
        assert o["param:0.weight_moment1_0"].shape == (4, 3) and o["param:0.weight_beta1_pow_acc_0"].shape == (1,)
        held.append(holdings(m, o))
        specs.append(block_specs(splits, rank, 2, m, o))
        files[shard_file(rank, 2)] = {**{f"model/{k}": v for k, v in m.items()},
                                      **{f"optimizer/{k}": v for k, v in o.items()}}
    assert specs[1]["model/0.weight"] == {"shape": [4, 6], "offsets": [0, 3]}
    assert specs[1]["optimizer/param:1.weight_moment1_0"] == {"shape": [6, 4], "offsets": [3, 0]}
    index = plan(held, specs)
    assert len(index["model/1.bias"]["parts"]) == 1  # whole on both ranks: written once
    got_model, got_opt = assemble(index, files.__getitem__)
    for k, v in model.items():
        np.testing.assert_array_equal(got_model[k], v)
    for k, v in opt.items():
        np.testing.assert_array_equal(got_opt[k], v)


def test_the_layout_answers_what_each_rank_loads_and_saves_and_one_process_takes_the_state_as_it_is():
    """checkpoint.load and checkpoint.snapshot ask the Layout (local_state, saved_blocks), never the degrees: on
    one process the answer is the state itself; on two tensor-parallel ranks, blocks that put together again."""
    model = split_model()
    whole, opt = whole_state()
    single = Layout.plan(world_size=1)
    assert single.local_state(model, whole, opt) == (whole, opt)
    m, o = dict(whole), dict(opt)
    assert single.saved_blocks(model, m, o) == {} and m == whole and o == opt
    assert single.whole_state(model).keys() == model.state_dict().keys() and single.whole_model(model) is model
    held, specs, files = [], [], {}
    for rank in range(2):
        layout = Layout.plan(world_size=2, rank=rank, tensor_parallel_degree=2)
        m, o = layout.local_state(model, whole, opt)
        assert m["0.weight"].shape == (4, 3) and whole["0.weight"].shape == (4, 6)  # the whole state is left whole
        held.append(holdings(m, o))
        specs.append(layout.saved_blocks(model, m, o))
        files[shard_file(rank, 2)] = {**{f"model/{k}": v for k, v in m.items()},
                                      **{f"optimizer/{k}": v for k, v in o.items()}}
    assert specs[1]["model/0.weight"] == {"shape": [4, 6], "offsets": [0, 3]}
    got_model, got_opt = assemble(plan(held, specs), files.__getitem__)
    for k, v in {**whole, **opt}.items():
        np.testing.assert_array_equal((got_model if k in whole else got_opt)[k], v)
    with pytest.raises(ValueError, match="0.weight has 6 rows on axis 1, which do not split over tensor_parallel_deg"):
        Layout.plan(world_size=4, tensor_parallel_degree=4).local_state(model, whole, opt)


def test_a_dimension_that_does_not_split_is_named():
    model, opt = whole_state()
    with pytest.raises(ValueError, match="0.bias has 6 rows on axis 0, which do not split over tensor_parallel_degree=4"):
        local_blocks({"0.bias": 0}, 0, 4, model, opt)


def test_a_model_without_tensor_parallel_layers_is_named_in_one_warning_line():
    from trainer.layout import Layout
    from trainer.parallel.apply import unsplit_model_warning

    plain = paddle.nn.Sequential(paddle.nn.Linear(4, 6), paddle.nn.Linear(6, 4))
    warning = unsplit_model_warning(plain, Layout.plan(2, tensor_parallel_degree=2))
    assert warning.startswith("tensor_parallel_degree=2 but Sequential has no tensor-parallel layers") and "\n" not in warning
    assert unsplit_model_warning(split_model(), Layout.plan(2, tensor_parallel_degree=2)) is None
    assert unsplit_model_warning(plain, Layout.plan(2)) is None
