"""Model implementations: BART and its variants, T5, Whisper, shared layers, the registry."""
