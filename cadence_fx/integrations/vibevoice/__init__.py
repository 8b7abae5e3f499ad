"""VibeVoice's acoustic decoder (``vibevoice==0.0.1``), in layers.

``inputs``: one latent frame, checked; ``stock``: the tokenizer at the released
configuration, its structure, declared carries and ``VibeVoiceDecoder`` (upstream's own
streaming decode); ``cache``: upstream's streaming cache over the step's state;
``adapter``: the decode on arena memory; ``dropin``: ``OptimizedVibeVoice``.  Each layer
imports only the ones before it; the public names are re-exported here.
"""

from ...pcm import pcm_bytes
from .adapter import VibeVoiceAdapter, explain_adapter
from .cache import arena_cache_class, check_declaration, decode_step
from .dropin import OptimizedVibeVoice
from .inputs import VAE_DIM, latent_tensor
from .stock import (CONTEXT, DEPTHS, RATIOS, RELEASED_CONFIG, UPSTREAM_DISTRIBUTION, UPSTREAM_VERSION, Carry,
                    VibeVoiceDecoder, VibeVoiceStream, build_acoustic_tokenizer, clock_names, conv_carries,
                    declaration_for, dims_of, layer_carries, stage_dims, structure_of, synthetic_latents,
                    upstream_modules, vibevoice_declaration)
