"""Kubernetes integration: the DRA kubelet plugin (driver gpuslice.dev) and the device
plugin, their ResourceSlices, claims and CDI specs (docs/kubernetes.md)."""

from gpuslice.state import OWNED_NODE_MODE

DRIVER = "gpuslice.dev"  # the DRA driver name and the device plugin's resource domain
NODE_MODE = OWNED_NODE_MODE  # the mode of the nodes of the plugins' instances (state.py)
