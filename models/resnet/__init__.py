"""ResNet image classification: ``ptrain run resnet50`` (see task.py)."""
