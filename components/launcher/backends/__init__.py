"""Backends that run a TrainSpec: ``kubernetes`` (the Training Operator) and ``local``."""
