"""Weight loaders: local Hugging Face directories and CTranslate2 model.bin files."""
import os
from typing import Union

PathLike = Union[str, os.PathLike]
