"""How checks run: the registry (`@check`), the per-run context with typed facts between checks,
and the runner that gives each check a deadline and always ends with a summary."""
