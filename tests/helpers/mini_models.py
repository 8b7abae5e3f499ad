"""Registers the mini Token2Wav (``helpers.mini_token2wav.MODEL``) when imported: what
``CADENCE_FX_MODELS=helpers.mini_models`` makes a process the tests start (a serve-sim
check worker, a Ray replica) import before it looks a model up (cadence_fx.tools.registry)."""

from helpers.mini_token2wav import register

register()
