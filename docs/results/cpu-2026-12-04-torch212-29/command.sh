#!/bin/bash
# session 36, this CPU machine (2 cores, no GPU; nothing else running): the CPU suite on torch 2.12.0
# and 2.9.1 (not run before), each a clean clone of main at 93bc385 in its own venv: torch from PyPI
# (its default build; runs on the CPU), the upstream packages --no-deps and the extras as README's
# test command installs them.
for v in 2.12.0 2.9.1; do
  s=$(echo $v | cut -d. -f1,2 | tr -d .)      # 212, 29
  python3 -m venv /tmp/v$s && . /tmp/v$s/bin/activate
  pip download torch==$v --no-deps -d /tmp/t$s && pip install /tmp/t$s/torch-$v-*.whl
  git clone /work/main /tmp/ci$s && cd /tmp/ci$s
  pip install --no-deps stepaudio2-minicpmo==0.1.1 moshi==0.2.13 vibevoice==0.0.1 && pip install -e ".[models,test,ray]"
  python -c "import torch, cadence_fx; print(torch.__version__, cadence_fx.__file__); from cadence_fx.passes import trace; print('records autocast:', trace._records_autocast(), 'asks context:', trace.make_fx_asks_the_context())"
  (time python -m pytest tests -q -n 2 --dist loadfile -p no:cacheprovider > pytest-torch$s.log 2>&1) 2> pytest.time
done
# printed: 2.12.0+cu130 /tmp/ci212/cadence_fx/__init__.py / records autocast: True asks context: True
#          2.9.1+cu128 /tmp/ci29/cadence_fx/__init__.py / records autocast: True asks context: True
# pytest-torch212.log's last line: 628 passed, 64 skipped, 1 warning in 337.63s (0:05:37)
# pytest-torch29.log's last line: 628 passed, 64 skipped, 1 warning in 355.09s (0:05:55)
