"""Test doubles for the Kubernetes plugins: a kubelet and an API server stand-in."""
