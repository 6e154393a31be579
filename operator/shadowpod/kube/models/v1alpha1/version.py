"""The API group and version of this package's kinds."""

from __future__ import annotations

from typing import Final

GROUP: Final = "shadowpod.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "shadowpod.dev/v1alpha1"  # GROUP/VERSION, as a literal for the models' types
# ``kubectl get shadowpod`` lists every kind of the group.
CATEGORIES: Final = ("shadowpod",)
