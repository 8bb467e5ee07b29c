"""Check families, one module each; every module registers its checks with @registry.check."""
