"""A benchmark's path flag that cannot be used is refused before anything is measured: one line naming the
flag, exit 2. Before, ``python -m benchmarks checkpoint --dir D`` with a missing D measured for minutes, then
died in a FileNotFoundError traceback; a ``--markdown``/``--json`` into a missing directory failed likewise
at the very end, after the measurements."""

import importlib

import pytest

from benchmarks import BENCHMARKS

# every path flag of every benchmark (and of the two run as modules: save_stall, gpu_check)
CASES = [(name, flag) for name in BENCHMARKS for flag in ("--markdown", "--json")]
CASES += [("checkpoint", "--dir"), ("save_stall", "--dir"), ("gpu_check", "--json")]


def _module(name):
    return importlib.import_module(BENCHMARKS.get(name, f"benchmarks.{name}"))


@pytest.mark.parametrize("name,flag", CASES, ids=[f"{n} {f}" for n, f in CASES])
def test_a_path_in_a_missing_directory_is_one_line_and_exit_2(name, flag, tmp_path, capsys):
    missing = tmp_path / "missing"
    value = str(missing) if flag == "--dir" else str(missing / "report.out")
    with pytest.raises(SystemExit) as stop:
        _module(name).main([flag, value])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert f"argument {flag}: " in err and str(missing) in err and "Traceback" not in err
    assert not missing.exists()


def test_an_existing_directory_given_as_a_file_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _module("checkpoint").main(["--json", str(tmp_path)])
    assert stop.value.code == 2 and "is a directory: give a file name" in capsys.readouterr().err
