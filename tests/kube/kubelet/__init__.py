"""A kubelet and scheduler stand-in for the emulator: pods as local processes."""

from tests.kube.kubelet.kubelet import Kubelet

__all__ = ["Kubelet"]
