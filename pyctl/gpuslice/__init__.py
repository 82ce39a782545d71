"""gpuslice: controller for kernel-space GPU sharing (see docs/architecture.md)."""

__version__ = "0.1.0"
