"""The migration tables of PaddleNLP's and PaddleFormers' TrainingArguments, as Markdown.

- ``python -m trainer.compat.table`` prints PaddleNLP's (needs paddlenlp for its defaults), shown in
  docs/how-to/migrate-paddlenlp.md;
- ``python -m trainer.compat.table paddleformers`` prints PaddleFormers' from the table
  (``trainer.args.paddleformers_fields``) and PaddleFormers' defaults stored below (``PADDLEFORMERS_DEFAULTS``), so
  it needs no paddleformers: docs/hooks/generate.py keeps it in docs/how-to/migrate-paddleformers.md, checked in
  the main environment (tests/docs/test_site.py), where paddleformers is not installed;
- ``python -m trainer.compat.table paddleformers-defaults`` (in an environment with paddleformers) writes the
  stored defaults anew from the installed dataclass; tests/paddleformers/test_pf_fields.py fails while they differ.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import typing
from typing import Dict

from ..args import TrainingArguments, paddleformers_fields
from ..args.fields_table import FIELDS

KIND_WORDS = {"same": "same", "default": "different default", "renamed": "renamed",
              "recipe": "read from PaddleFormers' arguments (acts)",
              "script": "read by the script or model (as under PaddleFormers)",
              "ignored": "accepted, **no effect** (a set value warns)",
              "unsupported": "accepted, **no effect**: not supported (a set value warns)",
              "refused": "**refused** when set (a `ConfigError` naming it)"}

#: paddleformers' version whose defaults are stored below
PADDLEFORMERS_VERSION = "1.2.0"
# generated: paddleformers defaults (python -m trainer.compat.table paddleformers-defaults)
PADDLEFORMERS_DEFAULTS: Dict[str, str] = {
    'output_dir': 'required',
    'overwrite_output_dir': 'False',
    'do_train': 'False',
    'do_eval': 'False',
    'do_predict': 'False',
    'do_export': 'False',
    'evaluation_strategy': "'no'",
    'prediction_loss_only': 'False',
    'per_device_train_batch_size': '8',
    'per_device_eval_batch_size': '8',
    'gradient_accumulation_steps': '1',
    'eval_accumulation_steps': 'None',
    'learning_rate': '5e-05',
    'weight_decay': '0.0',
    'adam_beta1': '0.9',
    'adam_beta2': '0.999',
    'adam_epsilon': '1e-08',
    'max_grad_norm': '1.0',
    'num_train_epochs': '1.0',
    'max_steps': '-1',
    'lr_scheduler_type': "'linear'",
    'warmup_ratio': '0.0',
    'warmup_steps': '0',
    'num_cycles': '0.5',
    'lr_end': '1e-07',
    'power': '1.0',
    'min_lr': '0.0',
    'moe_router_bias_update_rate': '0.0',
    'freeze_training': 'False',
    'log_on_each_node': 'True',
    'logging_dir': 'None',
    'output_signal_dir': 'None',
    'logging_strategy': "'steps'",
    'logging_first_step': 'False',
    'logging_steps': '500',
    'save_strategy': "'steps'",
    'save_steps': '500',
    'save_total_limit': 'None',
    'save_on_each_node': 'False',
    'no_cuda': 'False',
    'seed': '42',
    'bf16': 'False',
    'fp16': 'False',
    'fp16_opt_level': "'O1'",
    'amp_master_grad': 'True',
    'bf16_full_eval': 'False',
    'fp16_full_eval': 'False',
    'amp_custom_black_list': "['reduce_sum', 'softmax_with_cross_entropy', 'c_softmax_with_cross_entropy', 'elementwise_div', 'sin', 'cos']",
    'amp_custom_white_list': "['lookup_table', 'lookup_table_v2', 'flash_attn', 'matmul', 'matmul_v2', 'fused_gemm_epilogue']",
    'sharding': "'stage1'",
    'sharding_degree': '-1',
    'sharding_parallel_size': '-1',
    'sharding_parallel_mesh_dimension': "'dp'",
    'sharding_comm_buffer_size_MB': '-1',
    'dsa_indexer_loss_coeff': '0.01',
    'sharding_comm_group_call_opt': 'False',
    'sharding_offload_opt_buffersize_GB': '-1',
    'save_sharded_model': 'False',
    'load_sharded_model': 'False',
    'load_sharded_model_remap_parameter_name': 'False',
    'sharded_model_from_ema': 'False',
    'tensor_model_parallel_size': '-1',
    'pipeline_model_parallel_size': '-1',
    'sep_parallel_size': '-1',
    'split_inputs_sequence_dim': 'True',
    'context_parallel_size': '-1',
    'cp_balance_mode': "'dualchunk_allgather'",
    'expert_model_parallel_size': '-1',
    'expert_tensor_model_parallel_size': '-1',
    'data_parallel_config': "''",
    'sequence_parallel': 'False',
    'fuse_sequence_parallel_allreduce': 'False',
    'sequence_parallel_config': "''",
    'tensor_parallel_config': "''",
    'pipeline_parallel_config': "''",
    'sharding_parallel_config': "''",
    'hybrid_parallel_topo_order': 'None',
    'recompute_granularity': 'None',
    'recompute_method': 'None',
    'recompute_modules': 'None',
    'recompute_num_layers': 'None',
    'recompute_mtp_granularity': 'None',
    'recompute_mtp_method': 'None',
    'recompute_mtp_modules': 'None',
    'scale_loss': '32768',
    'minimum_eval_times': 'None',
    'local_rank': '-1',
    'dataloader_shuffle': 'True',
    'dataloader_drop_last': 'False',
    'eval_steps': 'None',
    'max_evaluate_steps': '-1',
    'dataloader_num_workers': '0',
    'prefetch_factor': '2',
    'past_index': '-1',
    'run_name': 'None',
    'device': "'gpu'",
    'disable_tqdm': 'True',
    'remove_unused_columns': 'True',
    'label_names': 'None',
    'load_best_model_at_end': 'False',
    'metric_for_best_model': 'None',
    'greater_is_better': 'None',
    'ignore_data_skip': 'False',
    'optim': "'adamw'",
    'muon_exclude_patterns': "['embed', 'bias', 'lm_head', 'mlp.gate']",
    'use_lowprecision_moment': 'False',
    'report_to': 'None',
    'ddp_find_unused_parameters': 'None',
    'wandb_api_key': 'None',
    'wandb_http_proxy': 'None',
    'resume_from_checkpoint': 'None',
    'resume_from_huggingface_ckpt': 'None',
    'auto_parallel_resume_form_hybrid_parallel': 'False',
    'skip_memory_metrics': 'True',
    'flatten_param_grads': 'False',
    'lazy_data_processing': 'True',
    'use_async_save': 'False',
    'ordered_save_group_size': '0',
    'metrics_output_path': 'None',
    'skip_profile_timer': 'True',
    'distributed_dataloader': 'False',
    'unified_checkpoint': 'False',
    'to_static': 'False',
    'unified_checkpoint_config': "''",
    'ckpt_quant_stage': "'O0'",
    'ignore_load_lr_and_optim': 'False',
    'ignore_save_lr_and_optim': 'False',
    'force_reshard_pp': 'False',
    'enable_auto_parallel': 'False',
    'use_expert_parallel': 'False',
    'release_grads': 'False',
    'skip_data_intervals': 'None',
    'tensorwise_offload_optimizer': 'False',
    'optim_shard_num': '1',
    'save_sharding_stage1_model_include_freeze_params': 'False',
    'enable_zero_cost_checkpoint': 'False',
    'zcc_workers_num': '3',
    'zcc_pipeline_hooks_capacity_usage': '0.6',
    'zcc_save_ema_coef': 'None',
    'zcc_ema_interval': '1',
    'zcc_ema_loss_threshold': 'None',
    'save_tokenizer': 'True',
    'save_rng_states': 'True',
    'pdc_download_ckpt': 'False',
    'pdc_download_timeout': '300',
    'count_trained_tokens': 'False',
    'pad_token_id': '0',
    'flash_device_save_steps': '0',
    'split_norm_comm': 'False',
    'convert_from_hf': 'True',
    'save_to_hf': 'True',
    'nccl_comm_group_config': 'None',
    'reorder_pipeline_priority': 'False',
    'pre_alloc_memory': '0',
    'num_nextn_predict_layers': '0',
    'train_mtp_only': 'False',
    'mtp_distillation_loss': 'False',
    'mtp_num_layers': '0',
    'profile': 'False',
    'profile_step_start': '10',
    'profile_step_end': '12',
    'save_checkpoint_format': "'flex_checkpoint'",
    'load_checkpoint_format': "'flex_checkpoint'",
    'aoa_config': 'None',
    'load_via_cpu': 'True',
    'save_hf_steps': '-1',
    'save_hf_total_limit': 'None',
    'save_last_step': 'False',
    'save_hf_memory_growth_threshold': '8',
    'hybrid_parallel_expert_grad_scale': 'None',
    'use_intermediate_api': 'False',
    'offload_fp8_expert_master_weight': 'True',
    'use_cache': 'False',
    'load_from_hf': 'False',
    'deterministic_mode': 'False',
    'cp_comm_type': 'None',
    'replicate_saved_into_local': 'False',
    'dp_comm_overlap': 'False',
    'pp_sharding_comm_overlap': 'False',
    'tp_async_allreduce': 'False',
    'sp_async_reduce_scatter': 'False',
    'overlap_p2p_comm': 'False',
    'batch_p2p_comm': 'True',
    'variable_seq_lengths': 'False',
    'dp_allreduce_avg_in_gradinent_scale': 'False',
    'sp_allreduce_avg_in_gradinent_scale': 'False',
    'gradient_sync_after_accumulate': 'False',
    'mp_async_allreduce': 'False',
    'mp_skip_c_identity': 'False',
    'mp_fused_linear_param_grad_add': 'False',
    'pp_delay_scale_loss': 'True',
    'pp_sync_param': 'False',
    'tp_sync_param': 'False',
    'sync_grad': 'False',
    'tp_sync_moment': 'False',
    'pp_sync_moment': 'False',
    'replace_with_c_embedding': 'False',
    'replace_with_parallel_cross_entropy': 'False',
    'p2p_cache_shape': 'True',
    'partial_send_recv': 'True',
    'pp_release_grads': 'False',
    'clear_every_step_cache': 'False',
    'non_batch_p2p_comm': 'False',
    'auto_parallel_sync_shared_params': 'False',
    'best_unbalanced_scheduler': 'False',
    'offload_queue': 'False',
    'use_dualpipev': 'False',
    'forward_backward_overlap_scheduler': 'False',
    'send_recv_overlap': 'False',
    'split_backward': 'False',
    'timer': 'False',
    'stage1_tensor_fusion': 'False',
    'tensor_fusion': 'False',
    'stage1_overlap': 'False',
    'overlap': 'False',
    'stage2_overlap': 'False',
    'stage1_broadcast_overlap': 'False',
    'stage1_allgather_overlap': 'False',
    'stage1_reduce_avg': 'True',
    'fuse_optimizer_states': 'False',
    'sd_release_grads': 'False',
    'split_param': 'True',
    'muon_qkv_update_mode': "'split_head'",
    'muon_ffn_split': 'True',
    'muon_extra_scale_factor': '0.2',
    'muon_momentum': '0.95',
    'muon_version': '3',
    'muon_ns_steps': '5',
    'muon_ns_coeff_type': "'quintic'",
    'muon_ns_coeffs': 'None',
    'sd_sharding_comm_overlap': 'False',
    'sd_shardingv1_comm_overlap': 'False',
    'fa_version': 'None',
    'using_sonic_moe': 'False',
    'online_merge_ema': 'True',
    'flex_ckpt_comm_method': 'None',
}
# end of generated


def markdown() -> str:
    from paddlenlp.trainer import TrainingArguments as PaddleNLPArguments

    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    hints_theirs, hints_ours = typing.get_type_hints(PaddleNLPArguments), typing.get_type_hints(TrainingArguments)
    rows = ["| PaddleNLP field | PaddleNLP default | here | default here | type here, where it differs | notes |",
            "|---|---|---|---|---|---|"]
    for f in dataclasses.fields(PaddleNLPArguments):
        kind, note = FIELDS.get(f.name, ("unsupported", "not in the table yet"))
        theirs = _default(f)
        mine = _default(ours[f.name]) if f.name in ours else "-"
        types = ""
        if f.name in ours and type_name(hints_ours[f.name]) != type_name(hints_theirs[f.name]):
            types = f"`{type_name(hints_ours[f.name])}` (PaddleNLP: `{type_name(hints_theirs[f.name])}`)"
        rows.append(f"| `{f.name}` | {theirs} | {KIND_WORDS[kind]} | {mine} | {types} | {note} |")
    return "\n".join(rows)


def paddleformers_markdown() -> str:
    """PaddleFormers' table: every field in its dataclass's order, its default, what happens here, the field it
    lands in and that field's default here. Reads no paddleformers (its defaults are stored in this module)."""
    ours = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    table = paddleformers_fields.FIELDS
    rows = ["| PaddleFormers field | PaddleFormers default | here | field here | default here | notes |",
            "|---|---|---|---|---|---|"]
    for name, theirs in PADDLEFORMERS_DEFAULTS.items():
        kind, note = table.get(name, ("unsupported", "not in the table yet"))
        target = paddleformers_fields.target(name) if kind in ("same", "default", "renamed") else None
        here = f"`{target}`" if target else "-"
        mine = _default(ours[target]) if target in ours else "-"
        shown = theirs if theirs == "required" else f"`{theirs}`".replace("|", "\\|")
        rows.append(f"| `{name}` | {shown} | {KIND_WORDS[kind]} | {here} | {mine} | {note} |")
    return "\n".join(rows)


def paddleformers_counts_line() -> str:
    """One sentence with the table's counts, as the migration page states them."""
    n = paddleformers_fields.counts()
    return (f"Of PaddleFormers {PADDLEFORMERS_VERSION}'s {len(PADDLEFORMERS_DEFAULTS)} fields, {n['has effect']} have "
            f"their effect here, {n['warned']} are accepted without one (a set value is named in one warning) and "
            f"{n['refused']} are refused when set.")


def installed_paddleformers_defaults() -> Dict[str, str]:
    """The defaults of the installed paddleformers' TrainingArguments, as :data:`PADDLEFORMERS_DEFAULTS` stores them."""
    from paddleformers.trainer import TrainingArguments as PaddleFormersArguments

    return {f.name: _default_text(f) for f in dataclasses.fields(PaddleFormersArguments)}


def write_paddleformers_defaults(path: str = __file__) -> bool:
    """Rewrite :data:`PADDLEFORMERS_DEFAULTS` in this file from the installed paddleformers; whether it changed."""
    import paddleformers

    with open(path, encoding="utf-8") as f:
        source = f.read()
    body = "".join(f"    {name!r}: {text!r},\n" for name, text in installed_paddleformers_defaults().items())
    fresh = re.sub(r"(PADDLEFORMERS_VERSION = )\"[^\"]*\"", rf'\g<1>"{paddleformers.__version__}"', source)
    fresh = re.sub(r"(PADDLEFORMERS_DEFAULTS: Dict\[str, str\] = \{\n).*?(\}\n# end of generated)",
                   lambda m: m.group(1) + body + m.group(2), fresh, flags=re.S)
    if fresh != source:
        with open(path, "w", encoding="utf-8") as f:
            f.write(fresh)
    return fresh != source


def type_name(hint) -> str:
    """``Optional[bool]``, ``str``, ``IntervalStrategy``: a field's type as the table shows it."""
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    return repr(getattr(value, "value", value))


def _default(f: dataclasses.Field) -> str:
    text = _default_text(f)
    return text if text == "required" else f"`{text}`".replace("|", "\\|")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "paddlenlp"
    if which == "paddlenlp":
        print(markdown())
    elif which == "paddleformers":
        print(paddleformers_markdown())
    elif which == "paddleformers-defaults":
        changed = write_paddleformers_defaults()
        print(f"{'wrote' if changed else 'unchanged:'} {os.path.relpath(__file__)}: PADDLEFORMERS_DEFAULTS")
    else:
        sys.exit(f"python -m trainer.compat.table [paddlenlp | paddleformers | paddleformers-defaults], not {which!r}")
