"""VisualDL record files written on the caller's thread, without VisualDL's writer thread.

``visualdl.LogWriter`` hands every record to a writer thread through a queue. On
this project's 2-core CPU each ``add_scalar`` cost the training thread ~70 us:
each hand-off wakes the writer thread, which then holds the GIL while the
training thread waits for it. Building and framing the same record here costs
~6 us, and no thread is left to wait for.

The file is the one ``LogWriter`` writes, built with VisualDL's own pieces: the
meta record first (``visualdl.component.base_component.meta_data``, what
``LogWriter.add_meta`` writes), then one ``Record`` per scalar
(``base_component.scalar``), each framed by VisualDL's
``visualdl.writer.record_writer.RecordWriter`` (the record's length as 8
little-endian bytes, then its bytes, no CRC: what ``LogWriter`` writes).
``visualdl.LogReader`` and ``visualdl --logdir`` read it as they read
``LogWriter``'s files; VisualDL reads one value per record, so a record never
holds more than one scalar.

Durability: :meth:`ScalarRecordFile.write` hands the bytes to the operating
system (``flush``, no ``fsync``; ``LogWriter`` flushes every ``flush_secs``);
:meth:`ScalarRecordFile.close` flushes and closes.

    >>> import os, tempfile
    >>> from visualdl import LogReader
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = os.path.join(folder.name, "vdlrecords.0000000001.log")
    >>> f = ScalarRecordFile(path)
    >>> f.write([("train/loss", 0.5, 10, 1_700_000_000_000), ("train/loss", 0.25, 20, 1_700_000_001_000)])
    >>> f.close()
    >>> [(v.id, v.value) for v in LogReader(file_path=path).get_data("scalar", "train/loss")]
    [(10, 0.5), (20, 0.25)]
    >>> folder.cleanup()
"""

from __future__ import annotations

import time
from typing import Iterable, Tuple

from visualdl.component.base_component import meta_data, scalar
from visualdl.writer.record_writer import RecordWriter

Scalar = Tuple[str, float, int, int]  # tag, value, step, wall time (ms since the epoch)


class ScalarRecordFile:
    """A new VisualDL record file at ``path`` (created, or emptied), holding the meta record."""

    def __init__(self, path: str, display_name: str = ""):
        self.path = path
        self._file = open(path, "wb")
        self._records = RecordWriter(self._file)
        self._records.write(meta_data(display_name=display_name, walltime=round(time.time() * 1000)).SerializeToString())
        self._file.flush()

    def write(self, scalars: Iterable[Scalar]) -> None:
        """Append one record per ``(tag, value, step, walltime_ms)`` and hand them to the OS."""
        write = self._records.write
        for tag, value, step, walltime in scalars:
            write(scalar(tag=tag, value=value, step=step, walltime=walltime).SerializeToString())
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            self._file.close()
