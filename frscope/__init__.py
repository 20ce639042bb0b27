"""frscope: turns PyTorch's Flight Recorder into answers."""

__version__ = "0.1.0"
