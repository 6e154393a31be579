"""The Kubernetes operator: ``AgentSession`` and ``AgentMigration`` (``shadowpod.dev``).

``models`` is the API — pydantic spec and status, and the CRDs generated from them —
and imports no Kopf and no Kubernetes client, so anything may read it. Importing this
package imports nothing else.
"""
