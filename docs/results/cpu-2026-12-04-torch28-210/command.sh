#!/bin/bash
# session 36, this CPU machine (2 cores, no GPU; nothing else running): the CPU suite on torch 2.8.0
# and 2.10.0 (not run before: README says any torch >= 2.5 works), each a clean clone of main at
# c94f74a in its own venv: torch from PyPI (its default build; runs on the CPU), the upstream
# packages --no-deps and the extras as README's test command installs them.
for v in 2.8.0 2.10.0; do
  s=${v%.0}; s=${s//./}                       # 28, 210
  python3 -m venv /tmp/v$s && . /tmp/v$s/bin/activate
  pip download torch==$v --no-deps -d /tmp/t$s && pip install /tmp/t$s/torch-$v-*.whl
  git clone /work/main /tmp/ci$s && cd /tmp/ci$s
  pip install --no-deps stepaudio2-minicpmo==0.1.1 moshi==0.2.13 vibevoice==0.0.1 && pip install -e ".[models,test,ray]"
  python -c "import torch, cadence_fx; print(torch.__version__, cadence_fx.__file__); from cadence_fx.passes import trace; print('records autocast:', trace._records_autocast(), 'asks context:', trace.make_fx_asks_the_context())"
  (time python -m pytest tests -q -n 2 --dist loadfile -p no:cacheprovider > pytest-torch$s.log 2>&1) 2> pytest.time
done
# printed: 2.8.0+cu128 /tmp/ci28/cadence_fx/__init__.py / records autocast: True asks context: True
#          2.10.0+cu128 /tmp/ci210/cadence_fx/__init__.py / records autocast: True asks context: True
# pytest-torch28.log's last line: 628 passed, 64 skipped, 1 warning in 357.15s (0:05:57)
# pytest-torch210.log's last line: 628 passed, 64 skipped, 1 warning in 365.67s (0:06:05)
