"""TEST-ONLY: install ``tests/parallel/cpu_hybrid_shim.py`` in every Python process started with this folder on
PYTHONPATH and ``PTRAIN_TEST_HYBRID_SHIM=1`` (the ``ptrain`` end-to-end tests of tensor parallel on CPU: the
workers the launcher starts are not the test's own code). Never on the product's path."""

import os

if os.environ.get("PTRAIN_TEST_HYBRID_SHIM") == "1":
    import sys

    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
    import warnings

    # paddle loads here, before ptrain's console does: its import-time ccache notice, which the product filters
    # (trainer/__init__.py), would otherwise print
    warnings.filterwarnings("ignore", message="No ccache found")
    import parallel.cpu_hybrid_shim as _shim

    _shim.install()
