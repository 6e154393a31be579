"""The domain room: what a session *is*, independent of any transport or store.

Nothing here performs I/O or imports Kopf, aiohttp or a Kubernetes client.
"""
