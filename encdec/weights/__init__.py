"""Weight loaders: local Hugging Face directories and CTranslate2 model.bin files."""
