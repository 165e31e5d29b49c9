"""ERNIE text classification: ``ptrain run ernie`` (see task.py)."""
