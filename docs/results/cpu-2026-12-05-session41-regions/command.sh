#!/bin/bash
# CPU (this session's machine: 2 cores, torch 2.13.0+cpu), 2026-12-05, session forty-one, at 8ea36df.
# How the released Token2Wav's capacity graphs (5 flow steps, capacity 500 frames, a voice of 111
# tokens) partition for replay: per session against length-free (captures shared by voices,
# runtime.working). No device: compiler.preview_partition's op-level verdicts. On the CPU the
# attention probe keeps every attention over padded keys exact (an island here); on a GPU it may
# mask them (then they sit in the pieces). build_s is not a timing claim (the review agent ran
# tests on the machine meanwhile).
OMP_NUM_THREADS=2 python benchmarks/capacity_regions.py --n-timesteps 5 --capacity 500 --prompt-tokens 111 \
  > stdout-8ea36df.txt
# Again at e83ec60 (length_bound after the review: host arithmetic, call_module readers, readers of
# in-place results), stdout-e83ec60.txt: every entry line the same.
