"""``python -m benchmarks NAME [options]``: run one benchmark (``all``: each, with its defaults)."""

import importlib
import sys

from benchmarks import BENCHMARKS


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("benchmarks: " + ", ".join(BENCHMARKS) + ", all")
        print("options of one: python -m benchmarks NAME --help")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "all":
        code = 0
        for module in BENCHMARKS.values():
            code = code or importlib.import_module(module).main(rest)
        return code
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}: choose one of {', '.join(BENCHMARKS)}, all", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHMARKS[name]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
