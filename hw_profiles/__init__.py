"""The hardware energy profiles shipped with edgefl: one TOML file per target (a data package, so
installed wheels carry them too)."""
