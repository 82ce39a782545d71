"""Build hook: the kubelet gRPC modules are generated from the vendored protos
(pyctl/gpuslice/kube/proto) at build time; the rest of the metadata is pyproject.toml."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithProtos(build_py):
    def run(self) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "pyctl", "gpuslice", "kube"))
        try:
            import protogen  # the generator alone, without importing gpuslice
        finally:
            sys.path.pop(0)
        protogen.generate()
        # the package list was read before gen/ existed (a clean tree): add it
        if self.packages is not None and "gpuslice.kube.gen" not in self.packages:
            self.packages.append("gpuslice.kube.gen")
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
