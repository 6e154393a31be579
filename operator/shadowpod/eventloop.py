"""Running Shadowpod's processes on uvloop, the libuv event loop for asyncio.

The gateway, the agent runtime and the local tools spend most of their time in the
event loop and socket handling; uvloop carries the same work on noticeably less CPU,
which is what keeps a 2-core machine serving a thousand messages a second.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a uvloop event loop."""
    return uvloop.run(main)
