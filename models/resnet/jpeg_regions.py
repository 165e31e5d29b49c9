"""Decoding only the crop box of each JPEG in a batch: nvImageCodec's libjpeg-turbo CPU decoder.

A RandomResizedCrop box covers on average about half of an image, and the
rows below it need no decoding at all. libjpeg-turbo's region decode
(``jpeg_skip_scanlines`` / ``jpeg_crop_scanline``, which the TurboJPEG API of
the system's libjpeg-turbo 2.1 and ``simplejpeg`` do not expose) skips the
inverse DCT, upsampling and colour conversion outside the box and stops
after the box's last row. nvImageCodec (``nvidia-nvimgcodec-cu12``, a plain
wheel with no CUDA requirement on its CPU-only path) ships libjpeg-turbo 3
with that region decode, and decodes a list of regions in one call, which
spreads its per-call cost over the batch. Measured on the benchmark's
~500x375 JPEGs: 1.03 ms per image against 1.30 ms for a whole-image decode
with ``simplejpeg`` (both fast IDCT and upsampling, one thread).

Without a GPU only nvImageCodec's libjpeg-turbo extension is loaded (:func:`cpu_only_extensions`):
probing its GPU decoders printed "Failed to load nvJPEG library" where CUDA's nvJPEG is absent.

The decoder runs one thread of its own (``max_num_cpu_threads=1``: DataLoader
workers are the parallelism) and is made once per process and per mode (the
fast IDCT and upsampling for training, the accurate ones for evaluation),
again after a fork. When nvImageCodec cannot be imported, :func:`available`
is false and the callers decode whole images as before.

    >>> decode_regions([], [], fast=True)
    []
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

FAST_OPTIONS = "libjpeg_turbo_decoder:fast_idct=1 libjpeg_turbo_decoder:fancy_upsampling=0"
ACCURATE_OPTIONS = "libjpeg_turbo_decoder:fast_idct=0 libjpeg_turbo_decoder:fancy_upsampling=1"

_decoders: dict = {}
_missing: Optional[str] = None


#: nvImageCodec's CPU extensions (this module uses libjpeg-turbo's); the others (nvJPEG, nvJPEG2000, nvTIFF)
#: are GPU decoders, and loading one on a machine without CUDA prints "[ERROR] ... Failed to load nvJPEG
#: library" (once per process: 3-7 lines per ResNet run with its DataLoader workers)
CPU_EXTENSIONS = ("libjpeg_turbo_ext", "libopencv_ext", "libtiff_ext", "libnvbmp_ext", "libnvpnm_ext")


def cpu_only_extensions(gpu: bool) -> Optional[str]:
    """Without a GPU, point nvImageCodec at a folder holding only :data:`CPU_EXTENSIONS` (``NVIMGCODEC_EXTENSIONS_PATH``,
    read when a decoder is made) so it never probes the GPU decoders; with a GPU, or a path the user set, leave
    it alone. Returns the folder used, or None."""
    if gpu or os.environ.get("NVIMGCODEC_EXTENSIONS_PATH"):
        return None
    import importlib.util
    import tempfile

    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    source = os.path.join(list(spec.submodule_search_locations)[0], "extensions")
    if not os.path.isdir(source):
        return None
    folder = os.path.join(tempfile.gettempdir(), f"ptrain-nvimgcodec-cpu-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(source):
        if name.startswith(CPU_EXTENSIONS) and not os.path.lexists(os.path.join(folder, name)):
            try:
                os.symlink(os.path.join(source, name), os.path.join(folder, name))
            except FileExistsError:  # another process made it meanwhile
                pass
    os.environ["NVIMGCODEC_EXTENSIONS_PATH"] = folder
    return folder


def _gpu() -> bool:
    import paddle

    return paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


def _nvimgcodec():
    global _missing
    if _missing is not None:
        return None
    try:
        cpu_only_extensions(_gpu())
        from nvidia import nvimgcodec
    except Exception as exc:  # noqa: BLE001 - ImportError, or a wheel that does not load here
        _missing = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return None
    return nvimgcodec


def available() -> bool:
    """Whether nvImageCodec imports (else :func:`decode_regions` is not to be called)."""
    return _nvimgcodec() is not None


def _decoder(fast: bool):
    key = (fast, os.getpid())  # a forked DataLoader worker makes its own: the parent's thread is not there
    decoder = _decoders.get(key)
    if decoder is None:
        nvimgcodec = _nvimgcodec()
        decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                                     backends=[nvimgcodec.Backend(nvimgcodec.CPU_ONLY)],
                                     options=FAST_OPTIONS if fast else ACCURATE_OPTIONS)
        _decoders[key] = decoder  # a parent's decoder inherited through a fork stays untouched (never destroyed)
    return decoder


def decode_regions(datas: Sequence[bytes], regions: Sequence[Tuple[int, int, int, int]],
                   fast: bool) -> List[Optional[np.ndarray]]:
    """Each JPEG's ``(y0, x0, y1, x1)`` region (whole pixels, end exclusive) as an HWC uint8 RGB array,
    None for one nvImageCodec could not decode. Check for a complete file (:func:`complete`) first:
    like every libjpeg-based decoder that is not strict, it decodes a truncated file with grey rows."""
    if not datas:
        return []
    nvimgcodec = _nvimgcodec()
    out: List[Optional[np.ndarray]] = [None] * len(datas)
    streams, where = [], []
    for k, (data, (y0, x0, y1, x1)) in enumerate(zip(datas, regions)):
        try:
            region = nvimgcodec.Region(start=(y0, x0), end=(y1, x1))
            streams.append(nvimgcodec.CodeStream(data).get_sub_code_stream(region=region))
            where.append(k)
        except Exception:  # noqa: BLE001 - a stream it does not parse: None, the caller decodes it another way
            continue
    try:
        images = _decoder(fast).decode(streams) if streams else []
    except Exception:  # noqa: BLE001 - the batch failed as a whole: every caller decodes its own
        return out
    for k, image in zip(where, images):
        y0, x0, y1, x1 = regions[k]
        array = None if image is None else np.asarray(image.cpu())
        if array is not None and array.shape == (y1 - y0, x1 - x0, 3) and array.dtype == np.uint8:
            out[k] = array  # anything else (another layout or size): None, decoded another way
    return out


def complete(data: bytes) -> bool:
    """Whether the file ends with the JPEG end-of-image marker (within its last 64 bytes: trailing padding)."""
    return b"\xff\xd9" in data[-64:]
