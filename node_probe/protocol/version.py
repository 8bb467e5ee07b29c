"""The one version of both halves (plugin and probe); the report and `version` print it."""
__version__ = "0.1.0"
