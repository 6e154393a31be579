"""The operator's API as pydantic models, and the CRDs generated from them.

Pure: no Kopf, no Kubernetes client, no I/O. ``v1alpha1`` holds the kinds;
``openapi`` turns a model into a structural schema, ``crd`` into a
CustomResourceDefinition; ``structural`` and ``values`` check a CRD and an object the
way the API server does.
"""
