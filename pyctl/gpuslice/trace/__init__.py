"""Tracing: live BPF views of the interposer (`gpuctl trace`), and recorded ioctl traces (decoder, replay)."""
