"""The local runtime: gateway and agents as local processes, so a laptop with no
cluster runs a real live migration (``shadowpod demo``). Also the adapters that let
the engine drive them, and the load generator that checks what clients saw."""
