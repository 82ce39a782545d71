"""Operations: host checks (`gpuctl doctor`), the metrics exporter, CDI specs."""
