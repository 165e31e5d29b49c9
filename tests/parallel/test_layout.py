"""The layout object: planned once from the arguments (the one place the parallel fields are checked together),
plain JSON for the manifest, ranks in fleet's topology order."""

import json
import sys

import pytest

from trainer import TrainingArguments
from trainer.errors import ConfigError
from trainer.layout import Layout, parse_sharding


def test_plain_data_parallel_and_each_stage_describe_themselves_as_plain_json():
    assert Layout.plan(4).describe() == {"world_size": 4, "dp_degree": 4, "sharding_degree": 1, "sharding_stage": 0,
                                         "offload": False, "mp_degree": 1, "pp_degree": 1}
    for stage in (1, 2, 3):
        layout = Layout.plan(4, sharding=f"stage{stage} offload", sharding_parallel_degree=2)
        described = layout.describe()
        assert json.loads(json.dumps(described)) == described
        assert (described["dp_degree"], described["sharding_degree"], described["sharding_stage"], described["offload"]) == (2, 2, stage, True)
        assert (layout.shards_optimizer, layout.shards_gradients, layout.shards_parameters) == (True, stage >= 2, stage == 3)
        assert layout.clips_in_optimizer and layout.uses_hybrid_topology
    everyone = Layout.plan(2, sharding="stage2")  # -1: every rank in one sharding group
    assert (everyone.dp_degree, everyone.sharding_degree) == (1, 2)


def test_ranks_follow_fleets_topology_order_dp_outside_sharding():
    places = [(Layout.plan(4, rank=r, sharding="stage1", sharding_parallel_degree=2).dp_rank,
               Layout.plan(4, rank=r, sharding="stage1", sharding_parallel_degree=2).sharding_rank) for r in range(4)]
    assert places == [(0, 0), (0, 1), (1, 0), (1, 1)]
    writers = [Layout.plan(4, rank=r, sharding="stage1", sharding_parallel_degree=2).writes_shard for r in range(4)]
    assert writers == [True, True, False, False]  # the first replica of each shard
    assert [Layout.plan(2, rank=r).writes_shard for r in range(2)] == [True, False]  # unsharded: rank 0 alone


def test_one_process_or_a_sharding_group_of_one_is_plain_data_parallel():
    assert Layout.plan(1, sharding="stage3").sharding_stage == 0
    assert not Layout.plan(2, sharding="stage2", sharding_parallel_degree=1).sharded


@pytest.mark.parametrize("kwargs, message", [
    ({"sharding": "stage4"}, 'sharding=\'stage4\' is not allowed: use stage1, stage2 or stage3'),
    ({"sharding": "stage1 stage2"}, "names 2 stages"),
    ({"sharding": "offload"}, "offload needs a stage"),
    ({"sharding": "stage1", "sharding_parallel_degree": 3}, "sharding_parallel_degree=3 does not divide the 4 ranks"),
    ({"sharding_parallel_degree": 2}, "sharding_parallel_degree=2 but sharding is off"),
    ({"sharding_parallel_degree": 0}, "sharding_parallel_degree=0 is not allowed"),
    ({"master_grad": True}, "amp_master_grad with plain data parallel over 4 ranks is not supported"),
    ({"sharding": "stage2", "sharding_parallel_degree": 2, "master_grad": True},
     "amp_master_grad with sharding stage2 and data parallel"),
    ({"tensor_parallel_degree": 3}, "tensor_parallel_degree=3 does not divide the 4 ranks"),
    ({"tensor_parallel_degree": 2, "pipeline_parallel_degree": 4}, "tensor_parallel_degree=2 x pipeline_parallel_degree=4"),
    ({"tensor_parallel_degree": 2, "tensor_parallel_config": "enable_mp_turbo"},
     "tensor_parallel_config='enable_mp_turbo': enable_mp_turbo is not known"),
    ({"pipeline_parallel_degree": 2, "pipeline_parallel_config": "fast"}, "pipeline_parallel_config='fast': fast is not known"),
    ({"hybrid_parallel_topo_order": "mp_first"}, "hybrid_parallel_topo_order='mp_first' is not known"),
    ({"tensor_parallel_degree": 2, "sharding": "stage2"}, "sharding stage2 with tensor_parallel_degree=2"),
])
def test_invalid_combinations_are_one_line_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        Layout.plan(4, **kwargs)
    assert "\n" not in str(info.value)


def test_degrees_of_one_are_off_and_paddlenlps_sharding_list_is_read(monkeypatch):
    assert Layout.plan(4, tensor_parallel_degree=1, pipeline_parallel_degree=-1).describe()["dp_degree"] == 4
    assert parse_sharding(["stage2", "offload"]) == (2, True)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    args = TrainingArguments(sharding=["stage1"], output_dir="x")  # PaddleNLP's parsed form
    assert args.sharding == "stage1"
    with pytest.raises(ConfigError, match="amp_master_grad=True needs low-precision weights"):
        TrainingArguments(amp_master_grad=True, output_dir="x")
    with pytest.raises(ConfigError, match="sharding_parallel_degree=3 does not divide the 2 ranks"):
        TrainingArguments(sharding="stage1", sharding_parallel_degree=3, output_dir="x")


def test_the_layout_module_and_trainer_args_import_no_paddle():
    import os
    import subprocess

    from helpers import REPO

    code = "import sys, trainer.args, trainer.layout, trainer.parallel; print('paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.stdout.strip() == "False"


def test_the_arguments_plan_the_layout_once_and_hand_it_on(monkeypatch):
    """One Layout per run: planned where the fields are checked, read by the *_rank properties and taken by the
    Trainer (not re-planned); not a field, so to_dict() and the checkpoint's saved arguments do not change."""
    import dataclasses

    from helpers import make_mlp

    from trainer import Trainer

    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")
    args = TrainingArguments(output_dir="x", recompute=True)
    assert isinstance(args.layout, Layout) and args.layout is args.layout and args.layout.recompute
    assert set(args.to_dict()) == {f.name for f in dataclasses.fields(args)}
    assert Trainer(make_mlp(), args).layout is args.layout
    assert args.layout_for(1, 0) is args.layout
    # a process outside a launch checks the degrees on the fewest ranks they ask for; a Trainer there plans its own
    # world (one process), where they do not divide: one line naming the field, as before
    monkeypatch.delenv("PADDLE_TRAINERS_NUM")
    outside = TrainingArguments(output_dir="x", sharding="stage1", sharding_parallel_degree=2)
    assert outside.layout.world_size == 2 and outside.sharding_parallel_rank == 0
    with pytest.raises(ConfigError, match="sharding_parallel_degree=2 does not divide the 1 ranks"):
        Trainer(make_mlp(), outside)


def test_docstring_examples_of_the_layout_room():
    import doctest

    import trainer.layout.plan
    import trainer.layout.stages

    for module in (trainer.layout.plan, trainer.layout.stages):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_sharding_parallel_config_is_checked_with_the_layout(monkeypatch):
    layout = Layout.plan(2, sharding="stage1", sharding_parallel_config="split_param enable_stage1_tensor_fusion")
    assert layout.sharding_options == ("enable_stage1_tensor_fusion", "split_param")
    with pytest.raises(ConfigError, match="sharding_parallel_config='fuse_all': fuse_all is not known"):
        Layout.plan(2, sharding="stage1", sharding_parallel_config="fuse_all")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    with pytest.raises(ConfigError, match="enable_stage2_overlap is for sharding stage2, not stage1"):
        TrainingArguments(sharding="stage1", sharding_parallel_config="enable_stage2_overlap", output_dir="x")


@pytest.mark.parametrize("order, expected", [
    # rank -> (dp, pp, sharding, mp) on 8 ranks: dp 1 x pp 2 x sharding 2 x mp 2, as fleet's CommunicateTopology numbers them
    ("pp_first", {0: (0, 0, 0, 0), 1: (0, 0, 0, 1), 2: (0, 0, 1, 0), 4: (0, 1, 0, 0), 7: (0, 1, 1, 1)}),
    ("sharding_first", {0: (0, 0, 0, 0), 1: (0, 0, 0, 1), 2: (0, 1, 0, 0), 4: (0, 0, 1, 0), 7: (0, 1, 1, 1)}),
])
def test_hybrid_ranks_follow_the_topology_order(order, expected):
    for rank, (dp, pp, sharding, mp) in expected.items():
        layout = Layout.plan(8, rank, sharding="stage1", sharding_parallel_degree=2, tensor_parallel_degree=2,
                             pipeline_parallel_degree=2, hybrid_parallel_topo_order=order)
        assert (layout.dp_rank, layout.pp_rank, layout.sharding_rank, layout.mp_rank) == (dp, pp, sharding, mp)
        # ranks of one tensor/pipeline group read the same slice of the batch: sharding's 2 slices
        assert (layout.data_rank, layout.data_world_size) == (sharding, 2)
        assert layout.holds_loss == (pp == 1) and layout.writes_outputs == (pp == 1 and mp == 0)
        assert layout.clips_in_optimizer and layout.splits_parameters


def test_tensor_parallel_with_data_parallel_reads_per_replica():
    layouts = [Layout.plan(4, rank, tensor_parallel_degree=2, tensor_parallel_config="enable_mp_async_allreduce")
               for rank in range(4)]
    assert [(l.dp_rank, l.mp_rank, l.data_rank) for l in layouts] == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1)]
    assert layouts[0].describe()["dp_degree"] == 2 and layouts[0].tensor_options == ("enable_mp_async_allreduce",)
    assert [l.writes_shard for l in layouts] == [True, True, False, False]
    assert layouts[0].summary() == "4 ranks: dp 2 x mp 2"


def test_paddlenlps_rank_properties_of_the_arguments(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "3")
    args = TrainingArguments(output_dir="x", sharding="stage1", sharding_parallel_degree=2)
    assert (args.data_parallel_rank, args.sharding_parallel_rank, args.tensor_parallel_rank,
            args.pipeline_parallel_rank) == (1, 1, 0, 0)
