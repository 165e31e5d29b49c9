"""Launching: paddle's launcher started, supervised and started again.

Owns: the launcher flags shared by ``ptrain run`` and ``ptrain launch``
(``flags``), the launcher command and the restart loop (``restarts``), the
supervision of the launcher's process tree and the signals it is sent
(``supervise``), and the wrapper script that runs paddle's launcher with an
etcd master (``elastic``, run as a file), the requeue of a Slurm job stopped
by SIGUSR1 (``slurm``), and the job's console: the launcher's output relayed to
``ptrain``'s console and ``LOG_DIR/console.log`` (``relay``). Paddle's launcher does the
rendezvous and the process management; this room only decides its flags and
whether to start it again.

May import: ``trainer.errors``, ``trainer.process`` and ``trainer.checkpoint``
(is there a checkpoint to resume); never the loop, ``callbacks`` or the commands.

Used by: ``trainer.cli`` (``ptrain run`` with launcher flags, ``ptrain launch``).
"""
