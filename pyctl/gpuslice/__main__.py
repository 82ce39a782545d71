"""python -m gpuslice: the same as gpuctl."""

from .cli import main

main()
