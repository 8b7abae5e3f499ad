# CPU (this machine: 2 cores, torch 2.13.0), released Token2Wav, 2 steps, rule S, at 72fc868 plus
# capacity_prepare.serving (the guards read as Python functions; the counts it gives equal
# check_dims' at every length, checked at both capacities by hand and in the test of prepare):
python benchmarks/capacity_classes.py --json classes.json > stdout.txt
# "prepare": what prepare_capacity reports (lengths up to the capacity each shared graph serves, of
# those the catalog serves); "rule_serves": Token2Wav's rule (n new tokens divides mel frames + 99,
# the capacity's class) counted independently.  Equal for every shape at both capacities: at 512
# (611 = 13 x 47) the 13-token shapes serve 19 of 245 lengths, at 500 (599, prime) 221 of 239.
