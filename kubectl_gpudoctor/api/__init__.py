"""Talking to the API server: the client and its deadlines, paged lists and their page parsers,
the optional cluster-scoped lists. Nothing here knows about commands, probes or rendering.
"""
