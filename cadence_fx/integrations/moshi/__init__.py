"""Moshi's Mimi decoder (``moshi==0.2.13``), in layers.

``inputs``: one frame of codes, checked; ``stock``: ``MimiModel`` at the released
configuration, its declared state and where moshi keeps it, ``MimiDecoder`` (moshi's
own streaming decode) and ``VendorMimi`` (moshi's CUDA-graphed path); ``adapter``: the
decode on arena memory; ``dropin``: ``OptimizedMimi``.  Each layer imports only the
ones before it; the public names are re-exported here.
"""

from ...pcm import pcm_bytes
from .adapter import MimiAdapter, check_declaration, explain_adapter
from .dropin import OptimizedMimi
from .inputs import CARDINALITY, FRAME_SHAPES, N_Q, codes_tensor
from .stock import (ATTN, CARRIED, CONTEXT, CONV_CARRIES, DECODE_PATH, DIMS, FRAME_SAMPLES, LAYERS,
                    MIMI_DECLARATION, UPSTREAM_DISTRIBUTION, UPSTREAM_VERSION, VENDOR_EAGER, VENDOR_GRAPHED,
                    MimiDecoder, MimiStream, VendorMimi, bind_state, build_mimi, decode_streaming_modules,
                    read_state, streaming_twin, synthetic_codes, upstream_modules)
