"""Dtypes of what the native engine passes (``adapm._native.Directory``) return.

The passes return numpy views of buffers they sized themselves (native/directory_module.c
documents them, in the codec's dtypes of adapm/_wire/protocol.py); the raw buffers some return
are viewed with these.
"""

from __future__ import annotations

import numpy as np

KEYS = np.dtype("<i8")
