"""The migration table of PaddleNLP's ``TrainingArguments``: for every field of
paddlenlp 2.8.1's dataclass, how it maps here (``FIELDS``: name -> (kind, note)).

Kinds: ``same`` (same name and meaning), ``renamed`` (carried to the field named
in the note), ``default`` (same name, a different default here), ``ignored``
and ``unsupported`` (accepted with PaddleNLP's name, type and default, without an
effect here; the note says why). Data only, importing nothing: read by
``trainer.compat.args_convert`` (the conversion), ``trainer.compat.paddlenlp_fields``
(the fields' help) and ``trainer.compat.table`` (docs/how-to/migrate-paddlenlp.md).
"""

from typing import Dict, Tuple

_HYBRID = "tensor, pipeline and sep parallel are not supported: data parallel and sharding (trainer.parallel)"
_TP = "1 or -1 (off) is accepted; more is refused until tensor and pipeline parallel exist"
_AUTO = "auto parallel and static-graph training are not supported: dynamic-graph data parallel only"
_UC = ("checkpoints are always unified here: safetensors under one manifest, one shard per rank written at once "
       "in a sharded run, resharded onto any world size and sharding stage on resume (trainer.checkpoint.shards)")

FIELDS: Dict[str, Tuple[str, str]] = {
    "output_dir": ("default", "default output (required in PaddleNLP)"),
    "overwrite_output_dir": ("same", "a fresh run into a directory with checkpoints is refused unless set"),
    "do_train": ("same", "read by scripts"),
    "do_eval": ("same", "read by scripts"),
    "do_predict": ("same", "read by scripts"),
    "do_export": ("same", "read by scripts"),
    "evaluation_strategy": ("default", "default epoch (PaddleNLP: no)"),
    "prediction_loss_only": ("unsupported", "evaluation always returns predictions; drop compute_metrics for loss only"),
    "per_device_train_batch_size": ("same", ""),
    "per_device_eval_batch_size": ("same", ""),
    "gradient_accumulation_steps": ("same", ""),
    "eval_accumulation_steps": ("same", "evaluation and prediction outputs move to the host every N steps (trainer.evaluation)"),
    "learning_rate": ("same", ""),
    "weight_decay": ("same", "ours: on parameters with 2+ dims; a PaddleNLP TrainingArguments keeps PaddleNLP's rule (names without bias or norm)"),
    "adam_beta1": ("same", ""),
    "adam_beta2": ("same", ""),
    "adam_epsilon": ("same", ""),
    "max_grad_norm": ("default", "default None = no clipping (PaddleNLP: 1.0); 0 also means no clipping"),
    "num_train_epochs": ("default", "default 3 (PaddleNLP: 1)"),
    "max_steps": ("same", ""),
    "lr_scheduler_type": ("same", "linear, cosine, constant (and step, multistep); polynomial is not supported"),
    "warmup_ratio": ("same", ""),
    "warmup_steps": ("same", ""),
    "num_cycles": ("unsupported", "cosine decays to 0 once; acts with a PaddleNLP TrainingArguments (paddlenlp's own schedule)"),
    "lr_end": ("unsupported", "polynomial decay is not supported; acts with a PaddleNLP TrainingArguments (paddlenlp's own schedule)"),
    "power": ("unsupported", "polynomial decay is not supported; acts with a PaddleNLP TrainingArguments (paddlenlp's own schedule)"),
    "log_on_each_node": ("ignored", "rank 0 logs"),
    "logging_dir": ("same", "where the trackers write (tensorboard/, wandb/, mlflow.db; default output_dir); metrics.jsonl and visualdl/ stay in output_dir"),
    "logging_strategy": ("same", ""),
    "logging_first_step": ("same", ""),
    "logging_steps": ("default", "default 10 (PaddleNLP: 500)"),
    "save_strategy": ("same", ""),
    "save_steps": ("same", ""),
    "save_total_limit": ("default", "default 3, the newest 3 of this run (PaddleNLP: None = keep all); the best checkpoint is always kept as well"),
    "save_on_each_node": ("ignored", "rank 0 writes checkpoints; use a shared output_dir on several nodes"),
    "no_cuda": ("same", "true means device cpu"),
    "seed": ("same", ""),
    "bf16": ("renamed", "amp bf16 (bf16 accepted too)"),
    "fp16": ("renamed", "amp fp16 (fp16 accepted too)"),
    "fp16_opt_level": ("default", "spells amp_level (default O1); default None = amp_level's (PaddleNLP: O1)"),
    "amp_master_grad": ("same", "with amp_level O2: float32 main_grad beside low-precision weights (paddle's mix_precision_utils); the optimizer clips them"),
    "bf16_full_eval": ("unsupported", "evaluation runs under the training AMP setting"),
    "fp16_full_eval": ("unsupported", "evaluation runs under the training AMP setting"),
    "amp_custom_black_list": ("unsupported", "AMP uses paddle's default op lists"),
    "amp_custom_white_list": ("unsupported", "AMP uses paddle's default op lists"),
    "sharding": ("same", "stage1 (fleet hybrid, DygraphShardingOptimizer), stage2 / stage3 (paddle's group_sharded_parallel), with offload; trainer.parallel"),
    "sharding_degree": ("renamed", "sharding_parallel_degree (PaddleNLP's older name, accepted too)"),
    "sharding_parallel_degree": ("same", "-1 = every rank; dp x sharding over fleet's hybrid topology"),
    "save_sharded_model": ("same", "a sharded run always saves each rank's shard at once, never gathered to one rank; "
                                   "False saves the same (it loads whole on any layout; export merges it)"),
    "load_sharded_model": ("same", "a resume always reads the shards, whichever layout wrote them; False the same"),
    "tensor_parallel_degree": ("unsupported", _TP),
    "pipeline_parallel_degree": ("unsupported", _TP),
    "sep_parallel_degree": ("unsupported", _HYBRID),
    "data_parallel_config": ("unsupported", _HYBRID),
    "tensor_parallel_config": ("unsupported", _HYBRID),
    "pipeline_parallel_config": ("unsupported", _HYBRID),
    "sharding_parallel_config": ("same", "enable_stage1_tensor_fusion, enable_stage1_overlap, split_param, disable_stage1_reduce_avg, enable_stage2_overlap"),
    "hybrid_parallel_topo_order": ("unsupported", _HYBRID),
    "recompute": ("same", "a PaddleNLP model through its enable_recompute switch; any other model block by block (LayerLists or recompute_modules) under paddle's non-reentrant recompute"),
    "scale_loss": ("unsupported", "the fp16 loss scaler starts at 2**15 (callbacks.AMP)"),
    "minimum_eval_times": ("unsupported", "set eval_steps"),
    "local_rank": ("same", "filled from the launcher's environment (PADDLE_RANK_IN_NODE), as in PaddleNLP"),
    "dataloader_drop_last": ("same", ""),
    "eval_steps": ("default", "default 0 = unset (PaddleNLP: None = logging_steps); set it with evaluation_strategy steps"),
    "max_evaluate_steps": ("unsupported", "evaluation covers the whole dataset; pass a smaller eval_dataset"),
    "dataloader_num_workers": ("same", ""),
    "past_index": ("unsupported", "no mems/past state between steps"),
    "run_name": ("same", "the trackers' run name (default the output_dir's name); TensorBoard: a subdirectory"),
    "device": ("default", "default auto, resolved to gpu or cpu (PaddleNLP: gpu)"),
    "disable_tqdm": ("default", "default False = the bar shows (PaddleNLP: None = shown unless the log level is above warning)"),
    "remove_unused_columns": ("same", "drops sample keys the model's forward does not take (labels kept)"),
    "label_names": ("same", ""),
    "load_best_model_at_end": ("same", ""),
    "metric_for_best_model": ("same", "accuracy and eval_accuracy both work"),
    "greater_is_better": ("same", ""),
    "ignore_data_skip": ("unsupported", "resume is exact: the sampler jumps to its position, nothing is replayed"),
    "optim": ("same", "adamw (also momentum, sgd); other PaddleNLP optimizers are not supported"),
    "report_to": ("default", "tqdm, jsonl, visualdl, png, tensorboard, wandb, mlflow; none, all (default tqdm, jsonl, visualdl; PaddleNLP: visualdl)"),
    "wandb_api_key": ("same", "report_to wandb logs online with it (without a key: offline)"),
    "resume_from_checkpoint": ("same", "a checkpoint directory of this project, auto or true"),
    "skip_memory_metrics": ("same", "False: each log record and results.json carry the peak host RSS (and on a GPU paddle's peak allocated/reserved), the largest over ranks (trainer.memory_stats)"),
    "flatten_param_grads": ("unsupported", "NPU only"),
    "lazy_data_processing": ("ignored", "datasets are used as given"),
    "skip_profile_timer": ("ignored", "callbacks are timed always (trainer.describe_callbacks())"),
    "distributed_dataloader": ("unsupported", "every rank reads its own shard"),
    "unified_checkpoint": ("same", _UC + "; False the same"),
    "to_static": ("unsupported", _AUTO),
    "unified_checkpoint_config": ("same", "async_save (or enable_all_options) sets save_async; "
                                          "skip_save_model_weight, master_weight_compatible: nothing to do here"),
    "ignore_load_lr_and_optim": ("unsupported", "a resume restores optimizer and scheduler: use a fresh run to reset them"),
    "ignore_save_lr_and_optim": ("unsupported", "checkpoints always hold optimizer and scheduler state"),
    "force_reshard_pp": ("unsupported", _HYBRID),
    "enable_auto_parallel": ("unsupported", _AUTO),
    "use_expert_parallel": ("unsupported", _HYBRID),
}
