"""A Kubernetes API server stand-in for tests: kmock's emulator, completed."""

from tests.kube.emulator.server import ApiServerEmulator

__all__ = ["ApiServerEmulator"]
