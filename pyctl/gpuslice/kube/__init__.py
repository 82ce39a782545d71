"""Kubernetes integration: the DRA kubelet plugin (driver gpuslice.dev) and the device
plugin, their ResourceSlices, claims and CDI specs (docs/kubernetes.md)."""

DRIVER = "gpuslice.dev"  # the DRA driver name and the device plugin's resource domain
# Mode of the nodes of instances the plugins make: NVIDIA's own nodes are 0666, so a
# container need not run as root. Who may open them is decided by the pod's device
# cgroup (the runtime allows the CDI device's nodes only) and, in the module, by
# require_device_cgroup (a process that may open the real nodes gets no instance node).
NODE_MODE = 0o666
