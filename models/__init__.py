"""Model implementations (installed as `encdec.models`)."""
