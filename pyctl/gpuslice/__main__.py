"""python -m gpuslice: the same as gpuctl."""

from gpuslice.cli import main

main()
