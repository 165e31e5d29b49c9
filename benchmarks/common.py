"""What the benchmark scripts share: running a measurement in a child process,
statistics over repeats, Markdown tables and a description of the machine.

A child process prints its result as one line ``BENCH_JSON {...}`` on stdout;
:func:`run_child` finds that line, so anything else the child prints (paddle's
warnings, progress bars) does not matter. The child's stderr goes to a file
that is shown when the child fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "BENCH_JSON "


class BenchmarkError(RuntimeError):
    """A measurement failed; the message names the command and ends with its stderr."""


class Parser(argparse.ArgumentParser):
    """A benchmark's options; a bad one is one line, ``PROG: error: ...``, and exit 2 (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def existing_dir(value: str) -> str:
    """``type=`` of a directory flag: it exists (checked before anything is measured)."""
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value} is not an existing directory: create it, or leave the flag out")
    return value


def output_file(value: str) -> str:
    """``type=`` of a file written at the end (``--markdown``, ``--json``): its directory exists now."""
    parent = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{value}: its directory {parent} does not exist: create it first")
    if os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value} is a directory: give a file name")
    return value


# ---- child side ----------------------------------------------------------------
def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024.0 if sys.platform != "darwin" else kib / 2 ** 20


def emit(result: dict) -> None:
    """Hand a child's result to the parent (one line on stdout)."""
    sys.stdout.write(MARKER + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def quiet_paddle_warnings() -> None:
    """Silence the import-time UserWarnings (no ccache, setuptools) in children."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


# ---- parent side ---------------------------------------------------------------
def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.update(extra or {})
    return env


def run_child(cmd: Sequence[str], timeout: float = 1800, env: Optional[Dict[str, str]] = None,
              all_results: bool = False):
    """Run ``cmd`` (in the repository root) and return the dict it emitted
    (``all_results``: the list of every dict it emitted)."""
    with tempfile.TemporaryFile(mode="w+") as err:
        try:
            proc = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO,
                                  env=env or child_env(), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchmarkError(f"timed out after {timeout:.0f} s: {' '.join(cmd)}") from None
        err.seek(0)
        stderr = err.read()
    results = [line[len(MARKER):] for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not results:
        tail = "\n".join((proc.stdout[-1500:], stderr[-3000:]))
        raise BenchmarkError(f"exit code {proc.returncode}, no result from: {' '.join(cmd)}\n{tail}")
    parsed = [json.loads(r) for r in results]
    return parsed if all_results else parsed[-1]


def median(values: Iterable[float]) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / median, in percent: the spread of the repeats."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return 0.0
    return 100.0 * (max(values) - min(values)) / statistics.median(values)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence], align: Optional[str] = None) -> str:
    """A GitHub Markdown table; ``align`` is one letter per column (l or r; default: first l, rest r)."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def machine_info() -> dict:
    """Cores, memory, CPU model, Python and paddle versions (paddle is imported in a child)."""
    info = {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        info["memory_gib"] = round(kib / 2 ** 20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    code = ("import json, warnings; warnings.simplefilter('ignore'); import paddle; "
            "print(json.dumps({'paddle': paddle.__version__, 'cuda': paddle.device.is_compiled_with_cuda()}))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env())
        info.update(json.loads(out.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError):
        info["paddle"] = "unknown"
    return info


def machine_line(info: dict) -> str:
    parts = [f"{info.get('cores')} cores", f"{info.get('memory_gib', '?')} GiB RAM", info.get("cpu", ""),
             f"Python {info.get('python')}", f"paddle {info.get('paddle')}"]
    return ", ".join(p for p in parts if p)


def load_line() -> str:
    """The 1/5/15-minute load averages: other work on the machine shows here."""
    try:
        one, five, fifteen = os.getloadavg()
        return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"
    except OSError:
        return "load average unavailable"


def fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_size(n_bytes: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.4g} {unit}"
    return f"{n_bytes} B"


def write_outputs(markdown: str, raw: dict, markdown_path: Optional[str], json_path: Optional[str]) -> None:
    if markdown_path:
        with open(markdown_path, "w", encoding="utf-8") as f:
            f.write(markdown + "\n")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1, sort_keys=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a launcher's ``--master``)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_logs(log_dir: str) -> str:
    """The tail of each rank's log of a ``paddle.distributed.launch`` run (``workerlog.N``), for an error message
    (the launcher's environment dumps beside them, ``backup_env.N.json`` and ``envlog.N``, say nothing of a failure)."""
    logs = ""
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        if name.startswith("workerlog."):
            with open(os.path.join(log_dir, name), errors="replace") as f:
                logs += f"\n--- {name}\n" + f.read()[-3000:]
    return logs


def read_json_files(paths: Iterable[str]) -> list:
    """Each file's JSON, in order (the ranks' results of a launch)."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def split_list(value: str) -> List[str]:
    return [v.strip() for v in value.split(",") if v.strip()]
