"""The gateway: the only way in and out of a session (aiohttp adapter over the journal).

Routes are thin: they authenticate, parse, call the journal store or the session
services (``shadowpod.sessions``) and map errors to HTTP answers with JSON bodies.
"""
