"""Makes ``doc_examples`` (this folder's helper) importable under --import-mode=importlib."""

import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
