"""The migration table of PaddleFormers' ``TrainingArguments`` (paddleformers 1.2.0): for every one of the 236 fields
of its dataclass, how it maps here (``FIELDS``: name -> (kind, note)). Beside it, for the conversion:
``RENAMED`` (PaddleFormers' names of the parallel degrees -> ours, carried by value when > 1), ``CARRIED`` (the
other ``renamed`` rows -> our field), ``SWITCHES`` (PaddleFormers' primary switches that are words of PaddleNLP's
``*_parallel_config`` strings here: name -> (our field, the word, the value that adds it)) and ``LLM_META`` (the
model-config fields PaddleFormers' ``llmmetaclass`` adds to subclasses such as ``SFTConfig``: ``script`` there).

Kinds, as in ``trainer.args.fields_table`` (PaddleNLP's table) with three more:

- ``same``: same name and meaning, a field of ours with PaddleFormers' default: carried;
- ``renamed``: carried to the field ``RENAMED`` or ``CARRIED`` names (``recompute_granularity``: any value but None
  is ``recompute=True``, as PaddleFormers' Trainer switches each sublayer's ``enable_recompute``; a switch adds its
  word to our ``*_parallel_config`` when it holds the value ``SWITCHES`` gives);
- ``default``: same name, a different default here: the door carries PaddleFormers' value, so a converted run
  behaves as PaddleFormers' (the note says where the defaults part and why);
- ``recipe``: no field of ours; read from PaddleFormers' arguments themselves by the run's recipe
  (``trainer.compat.paddleformers_recipe``: the schedule, the data order) or the callback adapter (its Hugging
  Face-format saves): it acts on a converted run, never carried, never warned (PaddleNLP's table calls such rows
  ``unsupported``: they act only with PaddleNLP's arguments);
- ``script``: read outside the Trainer, under PaddleFormers too: by the script, by the model's config (the
  workflows of ``paddleformers.cli`` copy it there) or by PaddleFormers' ``TrainingArguments`` itself when it is
  built (environment flags): the door leaves it where it is, never carried, never warned;
- ``ignored``: accepted without an effect on training here (the note says why); set to a value other than
  PaddleFormers' default it is named in one warning;
- ``unsupported``: likewise, for a feature this project does not have;
- ``refused``: a value other than PaddleFormers' default (for a ``*_size`` field: other than -1 and 1, which mean
  off) cannot be honoured and would change the numbers or crash later: the door refuses it in one line
  (``ConfigError`` naming the field; exit 2 under ``ptrain launch``), before anything is built.

Counts (paddleformers 1.2.0, 236 fields): has its effect 111 (same 48, renamed 23, default 14, recipe 9,
script 17), warned when set 117 (ignored 27, unsupported 90), refused 8 (``tests/paddleformers/test_pf_fields.py`` checks them).

Data only, importing nothing but PaddleNLP's table (``AS_PADDLENLP``: its rows that hold as they are). Read by
``trainer.compat.args_convert`` (the conversion at the door) and ``trainer.compat.table`` (the table of
docs/how-to/migrate-paddleformers.md, with PaddleFormers' defaults stored there);
``tests/paddleformers/test_pf_fields.py`` fails when a field of the installed paddleformers is missing.
"""

from typing import Dict, Tuple

from .fields_table import FIELDS as PADDLENLP_FIELDS

#: PaddleFormers' names of PaddleNLP's parallel degrees -> ours: carried by value when > 1 (-1 and 1 mean off)
RENAMED: Dict[str, str] = {
    "tensor_model_parallel_size": "tensor_parallel_degree",
    "pipeline_model_parallel_size": "pipeline_parallel_degree",
    "sharding_parallel_size": "sharding_parallel_degree",
}

#: PaddleFormers' primary switches that are a word of a ``*_parallel_config`` here: name -> (our field, word, the
#: value that adds the word). PaddleFormers reads them only where their layout runs (stage 1 on 2+ ranks, tensor or
#: pipeline parallel), as ours reads the words
SWITCHES: Dict[str, Tuple[str, str, bool]] = {
    "stage1_tensor_fusion": ("sharding_parallel_config", "enable_stage1_tensor_fusion", True),
    "stage1_overlap": ("sharding_parallel_config", "enable_stage1_overlap", True),
    "stage2_overlap": ("sharding_parallel_config", "enable_stage2_overlap", True),
    "stage1_reduce_avg": ("sharding_parallel_config", "disable_stage1_reduce_avg", False),
    "split_param": ("sharding_parallel_config", "split_param", True),
    "mp_async_allreduce": ("tensor_parallel_config", "enable_mp_async_allreduce", True),
    "mp_skip_c_identity": ("tensor_parallel_config", "enable_mp_skip_c_identity", True),
    "mp_fused_linear_param_grad_add": ("tensor_parallel_config", "enable_mp_fused_linear_param_grad_add", True),
    "pp_delay_scale_loss": ("pipeline_parallel_config", "enable_delay_scale_loss", True),
    "dp_comm_overlap": ("pipeline_parallel_config", "enable_dp_comm_overlap", True),
    "pp_sharding_comm_overlap": ("pipeline_parallel_config", "enable_sharding_comm_overlap", True),
    "overlap_p2p_comm": ("pipeline_parallel_config", "enable_overlap_p2p_comm", True),
    "batch_p2p_comm": ("pipeline_parallel_config", "disable_batch_p2p_comm", False),
    "p2p_cache_shape": ("pipeline_parallel_config", "disable_p2p_cache_shape", False),
    "partial_send_recv": ("pipeline_parallel_config", "disable_partial_send_recv", False),
    "pp_release_grads": ("pipeline_parallel_config", "enable_release_grads", True),
    "clear_every_step_cache": ("pipeline_parallel_config", "enable_clear_every_step_cache", True),
    "timer": ("pipeline_parallel_config", "enable_timer", True),
}
#: the other ``renamed`` rows -> our field: ``recompute_granularity`` (any value but None is ``recompute=True``),
#: ``ddp_find_unused_parameters`` (None = False) and every switch (its word added to that field)
CARRIED: Dict[str, str] = {"recompute_granularity": "recompute", "ddp_find_unused_parameters": "find_unused_parameters",
                           **{name: ours for name, (ours, _, _) in SWITCHES.items()}}

#: the fields paddleformers' ``llmmetaclass`` adds to a TrainingArguments subclass (``SFTConfig``, ...) beyond the
#: rows of FIELDS (and its properties, such as ``tensor_parallel_rank``): attributes of the model's config, which
#: the script copies there (``LlmMetaConfig.set_llm_config``) and PaddleFormers' Trainer never reads: ``script``
#: rows of such a subclass, never carried, never warned
LLM_META = (
    "use_fused_linear_cross_entropy", "apply_rope_fusion", "fuse_swiglu",
    "tensor_parallel_output", "num_empty_layers_add_in_head", "num_empty_layers_add_in_tail",
    "virtual_pipeline_model_parallel_size", "no_recompute_layers", "recompute_use_reentrant",
    "use_fused_head_and_loss_fn", "use_filtered_label_loss", "loss_subbatch_sequence_length",
    "moe_subbatch_token_num_before_dispatch", "moe_router_force_load_balancing", "moe_token_dispatcher_type",
    "use_unified_moe", "moe_deepep_num_sms", "moe_use_fusion_node", "moe_pad_expert_input_to_capacity",
    "moe_token_drop_policy", "moe_expert_capacity_factor", "router_aux_loss_coef", "router_z_loss_coef",
    "moe_router_load_balancing_type", "moe_shared_expert_overlap", "moe_dequant_input", "moe_expert_fusion",
    "moe_router_fusion", "moe_subbatch_token_num_after_dispatch", "moe_deep_gemm", "moe_ep_barrier", "fp8",
    "fp8_wgrad", "multi_latent_attention", "no_rope_freq", "position_embedding_type", "high_precision_rope",
    "gated_linear_unit", "normalization", "fp32_residual_connection", "softmax_scale", "softmax_type",
    "init_method", "output_layer_init_method", "embedding_init_method", "embedding_init_method_std",
    "experimental_dataflow", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "num_experts_per_tok", "hidden_size", "intermediate_size", "n_routed_experts", "use_qk_norm",
    "tie_word_embeddings",
)

_AUTO = "auto parallel and static-graph training are not supported: dynamic-graph data parallel only"
_AUTO_ONLY = "PaddleFormers applies it in auto-parallel mode only, which is not supported here (" + _AUTO + ")"
_CKPT = ("checkpoints are this project's own (safetensors under one manifest, one shard per rank, resumed onto any "
         "layout; trainer.checkpoint); PaddleFormers' checkpoint formats are neither written nor read by the Trainer")
_ZCC = "zero-cost (flash) checkpoints are not supported: " + _CKPT
_HF = "save_model() writes the model's save_pretrained(output_dir) as it is (save_hf_steps' saves too)"
_MUON = "the Muon optimizer is not supported (optim muon is refused: adamw, momentum, sgd)"
_MOE = "expert parallel and MoE-specific training are not supported"
_PP_CONFIG = "a fleet pipeline option ours does not set (pipeline_parallel_config words: trainer.layout.plan)"
_MODEL = "read by the model's config, which the script builds (paddleformers.cli's workflows copy it there)"
_PERF = "a speed or memory knob of PaddleFormers' own code path; the numbers do not depend on it"
_SYNC = "fleet's sync_param/sync_grad/sync_moment broadcasts are not set here (tensor and pipeline parallel)"
_UNREAD = "PaddleFormers 1.2 reads it nowhere either"


#: the fields whose PaddleNLP row (trainer.args.fields_table) holds for PaddleFormers as it is
AS_PADDLENLP = (
    "overwrite_output_dir", "do_train", "do_predict", "do_export", "prediction_loss_only",
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "eval_accumulation_steps", "learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "max_steps",
    "warmup_ratio", "warmup_steps", "log_on_each_node", "logging_dir", "logging_strategy", "logging_first_step",
    "save_strategy", "save_steps", "save_on_each_node", "seed", "bf16_full_eval", "fp16_full_eval",
    "save_sharded_model", "load_sharded_model", "scale_loss", "minimum_eval_times", "dataloader_drop_last",
    "max_evaluate_steps", "dataloader_num_workers", "past_index", "run_name", "remove_unused_columns",
    "label_names", "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "ignore_data_skip",
    "wandb_api_key", "resume_from_checkpoint", "skip_memory_metrics", "flatten_param_grads",
    "skip_profile_timer", "distributed_dataloader", "to_static", "ignore_load_lr_and_optim",
    "ignore_save_lr_and_optim", "enable_auto_parallel",
)


def _switch(name: str) -> Tuple[str, str]:
    ours, word, value = SWITCHES[name]
    return ("renamed", f"{ours}: {value} adds the word {word} (read where that layout runs)")


FIELDS: Dict[str, Tuple[str, str]] = {
    **{name: PADDLENLP_FIELDS[name] for name in AS_PADDLENLP},
    "output_dir": ("default", "default output (required in PaddleFormers)"),
    "do_eval": ("same", "read by scripts (PaddleFormers sets it when evaluation_strategy is not no)"),
    "evaluation_strategy": ("default", "default epoch (PaddleFormers: no)"),
    "weight_decay": ("same", "ours: on parameters with 2+ dims; a PaddleFormers TrainingArguments keeps PaddleFormers' rule (names without bias or norm)"),
    "max_grad_norm": ("default", "default None = no clipping (PaddleFormers: 1.0); 0 also means no clipping"),
    "num_train_epochs": ("default", "default 3 (PaddleFormers: 1)"),
    "lr_scheduler_type": ("same", "linear, cosine, constant (and step, multistep) with ours; a PaddleFormers TrainingArguments keeps PaddleFormers' own schedule"),
    "num_cycles": ("recipe", "acts with a PaddleFormers TrainingArguments: its own schedule (get_scheduler, trainer.compat.paddleformers_recipe) reads it from them; our TrainingArguments' schedule does not (cosine decays to 0 once)"),
    "lr_end": ("recipe", "acts with a PaddleFormers TrainingArguments: its own schedule (get_scheduler, trainer.compat.paddleformers_recipe) reads it from them; our TrainingArguments' schedule does not (polynomial decay)"),
    "power": ("recipe", "acts with a PaddleFormers TrainingArguments: its own schedule (get_scheduler, trainer.compat.paddleformers_recipe) reads it from them; our TrainingArguments' schedule does not (polynomial decay)"),
    "min_lr": ("recipe", "acts with a PaddleFormers TrainingArguments: its own schedule (get_scheduler, trainer.compat.paddleformers_recipe) reads it from them; our TrainingArguments' schedule does not (cosine decays to 0)"),
    "moe_router_bias_update_rate": ("script", "the SFT workflow's MoECorrectionBiasAdjustCallback reads it; pass that callback to callbacks="),
    "freeze_training": ("recipe", "True: PaddleFormers' recipe holds the learning rate at 0, so the parameters stay as they are (PaddleFormers also skips backward and the optimizer step)"),
    "output_signal_dir": ("ignored", "checkpoints are written in a background thread with no signal files (save_async)"),
    "logging_steps": ("default", "default 10 (PaddleFormers: 500)"),
    "save_total_limit": ("default", "default 3, the newest 3 of this run (PaddleFormers: None = keep all); the best checkpoint is always kept as well"),
    "no_cuda": ("same", "true means device cpu here; PaddleFormers 1.2 reads it nowhere (its device field decides)"),
    "bf16": ("same", "amp bf16 (PaddleNLP's spelling, kept by PaddleFormers); a CPU build trains in float32 with one warning"),
    "fp16": ("same", "amp fp16 (PaddleNLP's spelling, kept by PaddleFormers); a CPU build trains in float32 with one warning"),
    "fp16_opt_level": ("default", "spells amp_level; default None = amp_level's O1 (PaddleFormers: O1, the same level)"),
    "amp_master_grad": ("default", "default False (PaddleFormers: True, and its TrainingArguments raises unless fp16 or bf16 is set: on CPU pass amp_master_grad=False); here it needs amp_level O2 (fp16_opt_level O2), refused in one line otherwise"),
    "amp_custom_black_list": ("unsupported", "AMP uses paddle's default op lists (PaddleFormers' default adds 6 ops to the black list; PaddleNLP's: None); only GPU AMP differs, a CPU build trains in float32"),
    "amp_custom_white_list": ("unsupported", "AMP uses paddle's default op lists (PaddleFormers' default adds 6 ops to the white list; PaddleNLP's: None); only GPU AMP differs, a CPU build trains in float32"),
    "sharding": ("default", "default '' = off (PaddleFormers: stage1, which its TrainingArguments clears on 1 process); stage1 runs on CPU, stage2/3 need a GPU (refused in one line); trainer.parallel"),
    "sharding_degree": ("same", "PaddleNLP's older name of sharding_parallel_degree (deprecated by PaddleFormers), read the same way here"),
    "sharding_parallel_size": ("renamed", "sharding_parallel_degree: -1 = every rank; dp x sharding over fleet's hybrid topology"),
    "sharding_parallel_mesh_dimension": ("unsupported", _AUTO),
    "sharding_comm_buffer_size_MB": ("ignored", "fleet's default fused buffer size; " + _PERF),
    "dsa_indexer_loss_coeff": ("script", _MODEL),
    "sharding_comm_group_call_opt": ("unsupported", _MUON),
    "sharding_offload_opt_buffersize_GB": ("ignored", "sharding V2's offload buffer; " + _PERF),
    "load_sharded_model_remap_parameter_name": ("unsupported", _CKPT),
    "sharded_model_from_ema": ("unsupported", "no EMA weights: " + _CKPT),
    "tensor_model_parallel_size": ("renamed", "tensor_parallel_degree: fleet's tensor parallel over the hybrid topology; needs a GPU (refused in one line on a CPU build)"),
    "pipeline_model_parallel_size": ("renamed", "pipeline_parallel_degree: fleet's pipeline parallel, the model a PipelineLayer; needs a GPU (refused in one line on a CPU build)"),
    "sep_parallel_size": ("refused", "sep (segment) parallel is not supported: its ranks would silently become data-parallel ranks (another global batch) and the inputs would not be split"),
    "split_inputs_sequence_dim": ("ignored", "acts only with sep or context parallel, which are refused here"),
    "context_parallel_size": ("refused", "context parallel is not supported: the Trainer would not split the inputs along the sequence as the model's config expects"),
    "cp_balance_mode": ("ignored", "acts only with context parallel, which is refused here"),
    "expert_model_parallel_size": ("refused", _MOE + ": the model's experts would expect an expert-parallel group"),
    "expert_tensor_model_parallel_size": ("refused", _MOE + " (PaddleFormers: not supported either, DO NOT SET)"),
    "data_parallel_config": ("unsupported", "fleet's data-parallel options are not set here"),
    "sequence_parallel": ("refused", "sequence parallel is not supported: PaddleFormers' Trainer all-reduces the sequence-parallel parameters' gradients over the tensor-parallel group, which is not done here"),
    "fuse_sequence_parallel_allreduce": ("ignored", "acts only with sequence parallel, which is refused here"),
    "sequence_parallel_config": ("ignored", "acts only with sequence parallel, which is refused here"),
    "tensor_parallel_config": ("same", "enable_mp_async_allreduce, enable_mp_skip_c_identity, enable_mp_fused_linear_param_grad_add (fleet's mp_configs); deprecated by PaddleFormers for its mp_* switches, which add the same words"),
    "pipeline_parallel_config": ("same", "PaddleNLP's words, into fleet's pp_configs; deprecated by PaddleFormers for its switches (timer, overlap_p2p_comm, ...), which add the same words"),
    "sharding_parallel_config": ("same", "enable_stage1_tensor_fusion, enable_stage1_overlap, split_param, disable_stage1_reduce_avg, enable_stage2_overlap; deprecated by PaddleFormers for its switches (split_param, stage1_reduce_avg, ...), which add the same words"),
    "hybrid_parallel_topo_order": ("default", "None = pp_first here (PaddleNLP's); PaddleFormers fills None with sharding_first: the door carries that"),
    "recompute_granularity": ("renamed", "recompute: any value (full, full_attn, core_attn) switches each sublayer's enable_recompute, as PaddleFormers' Trainer does; the model's config decides what is recomputed"),
    "recompute_method": ("script", _MODEL),
    "recompute_modules": ("script", _MODEL + "; ours has a field of that name that names sublayers to wrap, another meaning: not carried"),
    "recompute_num_layers": ("script", _MODEL),
    "recompute_mtp_granularity": ("script", _MODEL),
    "recompute_mtp_method": ("script", _MODEL),
    "recompute_mtp_modules": ("script", _MODEL),
    "local_rank": ("same", "filled from the launcher's environment (PADDLE_RANK_IN_NODE), as in PaddleFormers"),
    "dataloader_shuffle": ("recipe", "False: PaddleFormers' data order reads the training data in order (trainer.compat.paddleformers_recipe)"),
    "eval_steps": ("default", "default 0 = unset (PaddleFormers: None = logging_steps); set it with evaluation_strategy steps"),
    "prefetch_factor": ("ignored", "paddle's DataLoader default prefetching; " + _PERF),
    "device": ("default", "default auto, resolved to gpu or cpu (PaddleFormers: gpu)"),
    "disable_tqdm": ("default", "default False = the bar shows (PaddleFormers: True = a line per log record, PaddleNLP: None)"),
    "optim": ("same", "adamw (also momentum, sgd); PaddleFormers' other optimizers (muon, adamw_mini, ...) are refused in one line"),
    "muon_exclude_patterns": ("unsupported", _MUON),
    "use_lowprecision_moment": ("refused", "16-bit AdamW moments are not supported: float32 moments would change the numbers"),
    "report_to": ("default", "tqdm, jsonl, visualdl, png, tensorboard, wandb, mlflow; none, all (default tqdm, jsonl, visualdl; PaddleFormers: None = visualdl)"),
    "ddp_find_unused_parameters": ("renamed", "find_unused_parameters (DataParallel); None = False"),
    "wandb_http_proxy": ("unsupported", "set HTTPS_PROXY for wandb instead"),
    "resume_from_huggingface_ckpt": ("script", "read by paddleformers.cli's DeepSeek-V3 pretraining workflow, not by its Trainer"),
    "auto_parallel_resume_form_hybrid_parallel": ("unsupported", _AUTO),
    "lazy_data_processing": ("ignored", "datasets are used as given (" + _UNREAD + ")"),
    "use_async_save": ("ignored", "checkpoints are always written in a background thread (save_async)"),
    "ordered_save_group_size": ("ignored", "ranks write their shards at once; " + _PERF),
    "metrics_output_path": ("unsupported", "metrics.jsonl in output_dir holds every log record; no per-rank metrics files"),
    "unified_checkpoint": ("same", "checkpoints are always unified here (safetensors under one manifest, one shard per rank, resharded onto any layout on resume; trainer.checkpoint.shards); False the same. PaddleFormers' own unified format is not written"),
    "unified_checkpoint_config": ("same", "async_save (or enable_all_options) sets save_async; the other words concern PaddleFormers' own format: nothing to do here"),
    "ckpt_quant_stage": ("unsupported", "checkpoints are not quantized: " + _CKPT),
    "force_reshard_pp": ("unsupported", "a resume always reshards onto the new layout (trainer.checkpoint.shards)"),
    "use_expert_parallel": ("refused", _MOE + ": the model's experts would expect an expert-parallel group"),
    "release_grads": ("ignored", "gradients are cleared after each step; " + _PERF),
    "skip_data_intervals": ("refused", "skipping training steps' data is not supported: every batch is trained"),
    "tensorwise_offload_optimizer": ("unsupported", "optimizer offload only as sharding 'stage2 offload' / 'stage3 offload' (GPU)"),
    "optim_shard_num": ("unsupported", _CKPT),
    "save_sharding_stage1_model_include_freeze_params": ("ignored", "a checkpoint holds every parameter, frozen ones included"),
    "enable_zero_cost_checkpoint": ("unsupported", _ZCC),
    "zcc_workers_num": ("unsupported", _ZCC),
    "zcc_pipeline_hooks_capacity_usage": ("unsupported", _ZCC),
    "zcc_save_ema_coef": ("unsupported", _ZCC),
    "zcc_ema_interval": ("unsupported", _ZCC),
    "zcc_ema_loss_threshold": ("unsupported", _ZCC),
    "save_tokenizer": ("unsupported", "save_model() always saves the tokenizer (processing_class) beside the model; checkpoints hold none"),
    "save_rng_states": ("ignored", "checkpoints always hold every rank's RNG state (an exact resume needs it)"),
    "pdc_download_ckpt": ("unsupported", "PaddleCloud checkpoint download is not supported"),
    "pdc_download_timeout": ("unsupported", "PaddleCloud checkpoint download is not supported"),
    "count_trained_tokens": ("unsupported", "log records carry tokens_per_second where batches hold input_ids; no trained-token count"),
    "pad_token_id": ("ignored", "PaddleFormers' Trainer reads it only to count trained tokens (count_trained_tokens), which is not supported"),
    "flash_device_save_steps": ("unsupported", _ZCC),
    "split_norm_comm": ("ignored", "the global norm is reduced over the hybrid groups as fleet does it; " + _PERF),
    "convert_from_hf": ("unsupported", "a resume reads this project's checkpoints only: " + _CKPT),
    "save_to_hf": ("unsupported", _HF),
    "nccl_comm_group_config": ("unsupported", "fleet's default NCCL group settings"),
    "reorder_pipeline_priority": ("unsupported", "set hybrid_parallel_topo_order (pp_first, sharding_first) instead"),
    "pre_alloc_memory": ("script", "read by paddleformers.cli's workflows, not by its Trainer"),
    "num_nextn_predict_layers": ("script", _MODEL),
    "train_mtp_only": ("unsupported", "multi-token-prediction training is not supported: the model's loss is trained as it returns it"),
    "mtp_distillation_loss": ("script", _MODEL),
    "mtp_num_layers": ("script", _MODEL),
    "profile": ("unsupported", "nsys profiling is not started by the Trainer: run the script under nsys"),
    "profile_step_start": ("unsupported", "nsys profiling is not started by the Trainer: run the script under nsys"),
    "profile_step_end": ("unsupported", "nsys profiling is not started by the Trainer: run the script under nsys"),
    "save_checkpoint_format": ("recipe", "the callback adapter makes save_hf_steps' saves with PaddleFormers' default flex_checkpoint, as its Trainer does; otherwise " + _CKPT),
    "load_checkpoint_format": ("unsupported", _CKPT),
    "aoa_config": ("unsupported", "FlexCheckpoint's weight mapping: " + _CKPT),
    "load_via_cpu": ("ignored", "checkpoints load through host memory here"),
    "save_hf_steps": ("recipe", "with save_strategy steps: every N steps the model is saved as save_model() saves it into hf_checkpoint-<step> and a PaddleFormers callback's on_save_hf fires, as in PaddleFormers (the callback adapter)"),
    "save_hf_total_limit": ("recipe", "after each of save_hf_steps' saves the newest N hf_checkpoint-<step> directories are kept and the older removed, as in PaddleFormers (the callback adapter)"),
    "save_last_step": ("unsupported", "a converted run saves on save_steps only, as under PaddleFormers' default; with our TrainingArguments flush_at_end (default true) saves the last step"),
    "save_hf_memory_growth_threshold": ("ignored", "a memory bound of PaddleFormers' own Hugging Face-format saver; " + _PERF),
    "hybrid_parallel_expert_grad_scale": ("unsupported", _MOE),
    "use_intermediate_api": ("unsupported", _AUTO),
    "offload_fp8_expert_master_weight": ("unsupported", _MOE + " (FP8 experts)"),
    "use_cache": ("ignored", "PaddleFormers' Trainer sets the model's config.use_cache to it (False by default); here the model keeps its own: the loss is the same, a model with use_cache true keeps its key/value cache in training (memory)"),
    "load_from_hf": ("unsupported", "a resume reads this project's checkpoints only: " + _CKPT),
    "deterministic_mode": ("script", "PaddleFormers' TrainingArguments sets FLAGS_cudnn_deterministic and FLAGS_embedding_deterministic when it is built"),
    "cp_comm_type": ("ignored", "acts only with context parallel, which is refused here (" + _UNREAD + ")"),
    "replicate_saved_into_local": ("unsupported", _CKPT),
    "dp_comm_overlap": _switch("dp_comm_overlap"),
    "pp_sharding_comm_overlap": _switch("pp_sharding_comm_overlap"),
    "tp_async_allreduce": ("ignored", _UNREAD),
    "sp_async_reduce_scatter": ("ignored", "acts only with sequence parallel, which is refused here"),
    "overlap_p2p_comm": _switch("overlap_p2p_comm"),
    "batch_p2p_comm": _switch("batch_p2p_comm"),
    "variable_seq_lengths": ("unsupported", _PP_CONFIG + ": enable_dynamic_shape"),
    "dp_allreduce_avg_in_gradinent_scale": ("unsupported", _AUTO_ONLY),
    "sp_allreduce_avg_in_gradinent_scale": ("unsupported", _AUTO_ONLY),
    "gradient_sync_after_accumulate": ("unsupported", _AUTO_ONLY),
    "mp_async_allreduce": _switch("mp_async_allreduce"),
    "mp_skip_c_identity": _switch("mp_skip_c_identity"),
    "mp_fused_linear_param_grad_add": _switch("mp_fused_linear_param_grad_add"),
    "pp_delay_scale_loss": _switch("pp_delay_scale_loss"),
    "pp_sync_param": ("unsupported", _SYNC),
    "tp_sync_param": ("unsupported", _SYNC),
    "sync_grad": ("unsupported", _SYNC),
    "tp_sync_moment": ("unsupported", _SYNC),
    "pp_sync_moment": ("unsupported", _SYNC),
    "replace_with_c_embedding": ("unsupported", _AUTO_ONLY),
    "replace_with_parallel_cross_entropy": ("unsupported", _AUTO_ONLY),
    "p2p_cache_shape": _switch("p2p_cache_shape"),
    "partial_send_recv": _switch("partial_send_recv"),
    "pp_release_grads": _switch("pp_release_grads"),
    "clear_every_step_cache": _switch("clear_every_step_cache"),
    "non_batch_p2p_comm": ("ignored", _UNREAD + " (batch_p2p_comm False is the switch)"),
    "auto_parallel_sync_shared_params": ("unsupported", _AUTO_ONLY),
    "best_unbalanced_scheduler": ("unsupported", _PP_CONFIG),
    "offload_queue": ("unsupported", _PP_CONFIG),
    "use_dualpipev": ("unsupported", _PP_CONFIG + " (DualPipeV schedule)"),
    "forward_backward_overlap_scheduler": ("unsupported", _PP_CONFIG),
    "send_recv_overlap": ("unsupported", _AUTO_ONLY),
    "split_backward": ("unsupported", _AUTO_ONLY),
    "timer": _switch("timer"),
    "stage1_tensor_fusion": _switch("stage1_tensor_fusion"),
    "tensor_fusion": ("unsupported", _AUTO_ONLY),
    "stage1_overlap": _switch("stage1_overlap"),
    "overlap": ("unsupported", _AUTO_ONLY),
    "stage2_overlap": _switch("stage2_overlap"),
    "stage1_broadcast_overlap": ("unsupported", "fleet's stage1 V1 broadcast overlap is not set here"),
    "stage1_allgather_overlap": ("unsupported", "fleet's stage1 V2 all-gather overlap is not set here"),
    "stage1_reduce_avg": _switch("stage1_reduce_avg"),
    "fuse_optimizer_states": ("unsupported", "optimizer states are kept per parameter"),
    "sd_release_grads": ("ignored", "gradients are cleared after each step; " + _PERF),
    "split_param": ("renamed", "sharding_parallel_config: True (PaddleFormers' default) adds the word split_param with stage1 on 2+ ranks: sharding V2, which needs a GPU (refused in one line on a CPU build, where PaddleFormers' own stage1 V2 fails too, needing amp_master_grad): set split_param=False for stage1 on CPU"),
    "muon_qkv_update_mode": ("unsupported", _MUON),
    "muon_ffn_split": ("unsupported", _MUON),
    "muon_extra_scale_factor": ("unsupported", _MUON),
    "muon_momentum": ("unsupported", _MUON),
    "muon_version": ("unsupported", _MUON),
    "muon_ns_steps": ("unsupported", _MUON),
    "muon_ns_coeff_type": ("unsupported", _MUON),
    "muon_ns_coeffs": ("unsupported", _MUON),
    "sd_sharding_comm_overlap": ("script", "read by paddleformers.cli's ERNIE pretraining trainer, not by PaddleFormers' Trainer"),
    "sd_shardingv1_comm_overlap": ("script", "read by paddleformers.cli's ERNIE pretraining trainer, not by PaddleFormers' Trainer"),
    "fa_version": ("script", "PaddleFormers' TrainingArguments sets FLAGS_flash_attn_version when it is built (2 on CPU)"),
    "using_sonic_moe": ("unsupported", _MOE + " (SonicMoE)"),
    "online_merge_ema": ("unsupported", "no EMA weights are merged during training"),
    "flex_ckpt_comm_method": ("unsupported", _CKPT),
}

#: the kinds of FIELDS, grouped as the counts above and the docs group them
HAS_EFFECT = ("same", "renamed", "default", "recipe", "script")
WARNED = ("ignored", "unsupported")
REFUSED = ("refused",)


def counts() -> Dict[str, int]:
    """How many fields have their effect here, are warned about when set, are refused when set."""
    kinds = [kind for kind, _ in FIELDS.values()]
    return {"has effect": sum(k in HAS_EFFECT for k in kinds), "warned": sum(k in WARNED for k in kinds),
            "refused": sum(k in REFUSED for k in kinds)}


def target(name: str) -> str:
    """The field of ours a ``same``, ``default`` or ``renamed`` row lands on."""
    return RENAMED.get(name) or CARRIED.get(name) or name
