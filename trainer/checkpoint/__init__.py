"""The run's files: checkpoints, their manifest, resume, and who owns the output_dir.

Owns: the checkpoint format and its checks (``manifest``), the directory of
checkpoints and the choice of the one to resume (``store``), what a checkpoint
holds (``snapshot``, ``rng``; the tensors it must hold, checked against its files: ``contents``), the
snapshot's host memory kept from save to save (``host_buffers``), safetensors written without holding the GIL
(``tensor_file``), writing complete-or-nothing (``writer``; a sharded
run's shards, every rank its own at once: ``sharded``), the sharded format that
reshards onto any layout (``shards``: who writes what, putting tensors together),
restoring a trainer (``load``),
what may change on resume (``resume``; the training data's fingerprint: ``fingerprint``),
and the output_dir's owner (``owner``: who a process is and whether it lives; ``lock``,
``output_dir``; ``fence``: the owner's generation, checked before every write that publishes a file).

May import: the loop's lower modules (``trainer.errors``, ``trainer.distributed``, ``trainer.ranks``,
``trainer.tensors``, ``trainer.heap``, ``trainer.data``) and ``trainer.layout`` (what a rank holds of the whole
model: a save writes and a resume loads what the layout answers); never the loop itself, the launcher,
the commands or callbacks.

Used by: ``trainer.Trainer`` (save, load, claim), the checkpoint, preemption and
spike-recovery callbacks, ``trainer.launch`` (is there a checkpoint to resume)
and ``trainer.cli`` (inspect, claim for a command).
"""

#: Set to ``auto`` by ``ptrain``'s launcher for every worker of a restarted (or elastic) job: ``Trainer.fit``
#: then resumes from the newest complete checkpoint (``resume.resume_after_restart``). Defined here, where
#: importing it loads nothing, so the launcher names it without importing paddle.
RESUME_ENV = "PTRAIN_RESUME"
