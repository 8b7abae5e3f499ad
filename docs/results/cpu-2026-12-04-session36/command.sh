#!/bin/bash
# session 36, this CPU machine (2 cores, no GPU, torch 2.13.0+cpu), at 9c6c146: issue 14's CPU line,
# an empty program cache; the last stdout line kept
CADENCE_FX_CACHE_DIR=$(mktemp -d) python -m cadence_fx verify --model token2wav --rules S --device cpu --prompt-tokens 23,41 --chunks 4 --json | tail -1 > verify-prompt-lengths.json
# printed by: python3 -c "import json; d=json.load(open('verify-prompt-lengths.json')); s=d['setups']; print(d['exact'], [x['setup_s'] for x in s], s[1]['setup_s']/s[0]['setup_s'])"
# True [18.94, 2.39] 0.12618796198521648
