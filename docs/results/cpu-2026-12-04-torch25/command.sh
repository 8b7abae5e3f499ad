#!/bin/bash
# session 35, this CPU machine (2 cores, no GPU): the CPU suite on torch 2.5.1, the oldest torch
# pyproject.toml admits (README: "any torch >= 2.5 works"). A clean clone of main at 36bfab3 with
# tests/helpers/graph_structure.py as committed after it (the first flow step may join the shared
# ones), in its own venv: torch 2.5.1 from PyPI (its default build; runs on the CPU), the upstream
# packages --no-deps and the extras as README's test command installs them.
python3 -m venv /tmp/v25 && . /tmp/v25/bin/activate
pip download torch==2.5.1 --no-deps -d /tmp/t211 && pip install /tmp/t211/torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl
git clone /work/main /tmp/ci25 && cd /tmp/ci25
pip install --no-deps stepaudio2-minicpmo==0.1.1 moshi==0.2.13 vibevoice==0.0.1 && pip install -e ".[models,test,ray]"
python -m pytest tests -q -n 2 --dist loadfile -p no:cacheprovider > pytest-before.log 2>&1
# after the fixes (09a3a80, 6555f9f, 985136c): the same clone pulled to 985136c, the same venv
cd /tmp/ci25 && git pull && python -m pytest tests -q -n 2 --dist loadfile -p no:cacheprovider > pytest-after.log 2>&1
# and torch 2.7.1 (between the two), its own venv and clone at ad964ce, the same way
python3 -m venv /tmp/v27 && . /tmp/v27/bin/activate && pip download torch==2.7.1 --no-deps -d /tmp/t211 && pip install /tmp/t211/torch-2.7.1-cp311-cp311-manylinux_2_28_x86_64.whl
git clone /work/main /tmp/ci27 && cd /tmp/ci27 && pip install --no-deps stepaudio2-minicpmo==0.1.1 moshi==0.2.13 vibevoice==0.0.1 && pip install -e ".[models,test,ray]"
python -c "from cadence_fx.passes import trace; print('records autocast:', trace._records_autocast(), 'asks context:', trace.make_fx_asks_the_context())"  # printed: records autocast: True asks context: True
python -m pytest tests -q -n 2 --dist loadfile -p no:cacheprovider > pytest-torch271.log 2>&1
