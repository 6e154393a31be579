"""Integrations of agent frameworks with the agent runtime SDK (``shadowpod.agent``).

Each is an optional extra (``pip install shadowpod[langgraph]``): it imports its
framework and the SDK; the SDK never imports an integration.
"""
