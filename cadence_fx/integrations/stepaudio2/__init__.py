"""MiniCPM-o 4.5 / Step-Audio2 Token2Wav tail (``stepaudio2-minicpmo==0.1.1``), in layers.

``stock``: upstream's modules at the released configuration, their declared state and
``Token2WavTail`` (upstream's ``Token2wav.stream`` restated); ``inputs``: what the
optimized model accepts; ``adapter``: the step on arena memory; ``session``: one
stream of the optimized model; ``dropin``: ``OptimizedToken2Wav``.  Each layer
imports only the ones before it.  The public names of every layer are re-exported
here (``from cadence_fx.integrations import stepaudio2 as s2; s2.Token2WavTail``).
"""

from ...pcm import pcm_bytes
from .adapter import (STOCK_BUFFER_SHAPES, STOCK_BUFFERS, SIGNATURE, Token2WavAdapter, explain_adapter,
                      module_buffer)
from .dropin import OptimizedToken2Wav
from .inputs import (MIN_CHUNK_TOKENS, MIN_FIRST_CHUNK_TOKENS, MIN_PROMPT_TOKENS, STOCK_CACHE_FRAMES, check_chunk,
                     check_prompt, tokens_tensor)
from .session import PendingChunk, Token2WavSession, step_chunk
from .stock import (CARRIED, CHUNK_TOKENS, LOOKAHEAD_TOKENS, MEL_CACHE_LEN, MEL_PER_TOKEN, PRE_LOOKAHEAD_CARRY,
                    RETAIN_FRAMES, SAMPLES_PER_MEL, SILENCE_TOKEN, SOURCE_CACHE_LEN, TOKEN2WAV_DECLARATION,
                    UP_CARRY, UPSTREAM_DISTRIBUTION, UPSTREAM_VERSION, VOCAB, StepConfig, Token2WavTail,
                    autocast_for, build_modules, fade_in_out, setup_step, stream_step, synthetic_chunks,
                    synthetic_prompt, trim_window, upstream_modules)
