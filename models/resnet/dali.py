"""``--data_backend dali``: ImageFolder batches decoded, cropped, resized and
flipped by an NVIDIA DALI pipeline (``pip install '.[dali]'``: nvidia-dali-cuda120).

How it feeds the Trainer: :class:`DaliImageFolder` is the same map-style
:class:`~models.resnet.imagefolder.ImageFolderDataset` with a batch method,
``__getitems__(indices)``, which the Trainer's in-process loader calls with
each batch of its sampler (``trainer.data.ResumableDistributedBatchSampler``).
So DALI reads exactly the samples our sampler picks:

* **sharded by rank** as every other dataset is (the sampler's interleaving);
* **resumable at a step boundary**: a resumed run's sampler computes its
  position (``set_epoch(epoch, start_batch)``), nothing is replayed, and the
  crop boxes and flips are drawn on the host from python's and numpy's RNGs
  (:mod:`models.resnet.crops`, the boxes of every backend), which the
  checkpoint restores; DALI's own random state plays no part.

Per batch: the files are read on the host (a JPEG's header gives its size, so
the box can be drawn), then one pipeline run does
``fn.decoders.image_slice`` (decode only the box) -> ``fn.resize`` (antialiased,
to ``size`` x ``size``) -> ``fn.flip`` -> CHW uint8. The model normalizes on the
device, as with the other backends.

Decoding runs on the CPU (DALI's libjpeg-turbo decoder, ``threads`` threads)
or, when paddle trains on a GPU, "mixed" (nvJPEG: Huffman on the CPU, the rest
on the GPU) with the batch handed to paddle over DLPack without a copy to the
host (:func:`pipeline_device`, the one GPU seam).

Files DALI does not get, decoded per sample by the turbo/Pillow path instead
(with the bad-image handling of ``ImageFolderDataset``: skip or fail): non-JPEG
files, CMYK/YCCK JPEGs, JPEGs without their end marker (truncated: DALI's
decoder would return them half grey without a word), unreadable files. A
batch DALI fails on is decoded per sample the same way (the pipeline is
rebuilt for the next batch).

``dataloader_num_workers`` must be 0 (DALI has its own threads; the task says
so in one line otherwise).
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .crops import flip_coin
from .imagefolder import MAX_IMAGE_PIXELS, ImageFolderDataset
from .turbo import JPEG_MAGIC, TURBO_COLORSPACES, TurboTransform

logger = logging.getLogger("models.resnet")

JPEG_END = b"\xff\xd9"


def dali_missing() -> Optional[str]:
    """None when ``nvidia.dali`` imports, else why not (one line)."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def pipeline_device() -> Tuple[str, Optional[int]]:
    """("mixed", gpu id) when paddle runs on a GPU, else ("cpu", None): the decode device and DALI's device_id."""
    import paddle

    device = paddle.get_device()
    if paddle.is_compiled_with_cuda() and device.startswith("gpu"):
        return "mixed", int(device.split(":")[1]) if ":" in device else 0
    return "cpu", None


def default_threads() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class DaliImageFolder(ImageFolderDataset):
    """An ImageFolder whose batches DALI decodes (see the module docstring).

    Args:
        root, classes, bad_images, max_pixels: as :class:`ImageFolderDataset`.
        transform: a :class:`~models.resnet.turbo.TurboTransform`: its size, resize
            and training/evaluation mode define the pipeline; it also decodes the
            files DALI does not get (``__getitem__`` uses it alone).
        threads: DALI's CPU threads (default: the CPUs of this process, at most 8).
        device: "cpu" or "mixed"; default: :func:`pipeline_device`.
    """

    def __init__(self, root: str, transform: TurboTransform, classes: Optional[Sequence[str]] = None,
                 bad_images: str = "skip", threads: int = 0, device: Optional[str] = None,
                 max_pixels: int = MAX_IMAGE_PIXELS):
        super().__init__(root, transform, classes=classes, bad_images=bad_images, max_pixels=max_pixels)
        self.threads = threads or default_threads()
        self.device = device
        self._pipe = None
        self._pipe_batch = 0
        self._device_id: Optional[int] = None
        self.dali_batches = 0       # batches DALI decoded (all or part of)
        self.fallback_samples = 0   # samples decoded per sample instead

    # ---- the pipeline ---------------------------------------------------------
    def _pipeline(self, batch: int):
        if self._pipe is not None and batch <= self._pipe_batch:
            return self._pipe
        from nvidia.dali import fn, pipeline_def, types

        if self.device is None:
            self.device, self._device_id = pipeline_device()
        elif self.device == "mixed" and self._device_id is None:
            self._device_id = pipeline_device()[1] or 0
        size, decode_device = self.transform.size, self.device

        @pipeline_def(batch_size=batch, num_threads=self.threads, device_id=self._device_id, exec_async=False,
                      exec_pipelined=False, prefetch_queue_depth=1)
        def graph():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)   # (x, y) in source pixels
            shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)     # (w, h)
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            images = fn.decoders.image_slice(encoded, anchor, shape, device=decode_device, output_type=types.RGB,
                                             normalized_anchor=False, normalized_shape=False)
            images = fn.resize(images, resize_x=size, resize_y=size, antialias=True, interp_type=types.INTERP_LINEAR)
            images = fn.flip(images, horizontal=flip)
            return fn.transpose(images, perm=[2, 0, 1])

        self._pipe = graph()
        self._pipe.build()
        self._pipe_batch = batch
        return self._pipe

    def _run(self, pipe, encoded: List[np.ndarray], boxes: List[tuple], flips: List[int]):
        pipe.feed_input("encoded", encoded)
        pipe.feed_input("anchor", [np.asarray([b[1], b[0]], dtype=np.float32) for b in boxes])
        pipe.feed_input("shape", [np.asarray([b[3], b[2]], dtype=np.float32) for b in boxes])
        pipe.feed_input("flip", [np.asarray(f, dtype=np.int32) for f in flips])
        (out,) = pipe.run()
        return _host_or_device(out, self.device)

    # ---- batches ----------------------------------------------------------------
    def _prepare(self, j: int):
        """(encoded bytes, box, flip) of sample ``j`` for DALI, or None: it goes the per-sample way. Whether
        a file was marked unreadable before plays no part: the draws are a function of the files (exact resume)."""
        import simplejpeg

        try:
            data = np.fromfile(self.path(j), dtype=np.uint8)
        except OSError:
            return None
        head = data[:2].tobytes()
        if head != JPEG_MAGIC or JPEG_END not in data[-64:].tobytes():
            return None
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return None
        if colorspace not in TURBO_COLORSPACES or (self.max_pixels and height * width > self.max_pixels):
            return None  # per sample: Pillow's path decodes it, or names it (over max_pixels)
        top, left, h, w = self.transform.box(height, width)
        flip = int(self.transform.train and flip_coin())
        return data, (top, left, min(h, height - top), min(w, width - left)), flip

    def __getitems__(self, indices: Sequence[int]) -> list:
        indices = [int(i) for i in indices]
        prepared = [self._prepare(i) for i in indices]
        chosen = [k for k, p in enumerate(prepared) if p is not None]
        samples: List = [None] * len(indices)
        if chosen:
            pipe = self._pipeline(len(chosen))  # outside the try: a pipeline that cannot be built is an error
            try:
                images = self._run(pipe, [prepared[k][0] for k in chosen], [prepared[k][1] for k in chosen],
                                   [prepared[k][2] for k in chosen])
            except Exception as exc:  # noqa: BLE001 - a file DALI cannot decode: per sample, pipeline rebuilt
                logger.warning("DALI could not decode a batch (%s): decoding its %d samples one by one",
                               str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__,
                               len(chosen))
                self._pipe = None
                chosen = []
            else:
                self.dali_batches += 1
                for pos, k in enumerate(chosen):
                    samples[k] = (images[pos], self.labels[indices[k]])
        on_gpu = bool(chosen) and self.device == "mixed"
        for k, i in enumerate(indices):
            if samples[k] is None:
                self.fallback_samples += 1
                samples[k] = self[i]
                if on_gpu:  # one batch, one kind of array: the host-decoded image joins the others on the card
                    samples[k] = (_to_device(samples[k][0], images), samples[k][1])
        return samples

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pipe"], state["_pipe_batch"] = None, 0  # a DALI pipeline does not pickle: built again where used
        return state


def _to_device(image: np.ndarray, like):
    import paddle

    return paddle.to_tensor(image, place=like.place)


def _host_or_device(out, device: str):
    """The batch as an indexable of CHW uint8 images: a numpy array on the CPU; on a GPU a paddle
    tensor shared with DALI's output over DLPack (the GPU seam; no copy to the host)."""
    if device != "mixed":
        return out.as_array()
    import paddle

    # DALI reuses its output buffer on the next run: the clone is the batch's own memory (on the GPU)
    return paddle.utils.dlpack.from_dlpack(out.as_tensor()).clone()
