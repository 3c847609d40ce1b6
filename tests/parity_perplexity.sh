# Sourced by tests/parity.sh and tests/parity_moe.sh: the perplexity check
# both make against llama.cpp's figure.

# The PPL figure of a perplexity run's output on stdin (llama-perplexity's
# "Final estimate: PPL = x" and minfer's line have the same form).
ppl_of() { sed -n 's/.*PPL = \([0-9.]*\).*/\1/p'; }

# perplexity_matches GOT WANT: GOT within 0.5 % of llama.cpp's WANT; an empty
# GOT (a run that printed no figure) does not match.
perplexity_matches() {
  /usr/bin/python3 -c 'import sys
g, w = float(sys.argv[1] or "nan"), float(sys.argv[2])
sys.exit(0 if abs(g - w) / w <= 0.005 else 1)' "$1" "$2"
}
