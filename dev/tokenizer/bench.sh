#!/usr/bin/env bash
# Tokenizer benchmark: ours (data_prep/bench_tokenize) beside npm tiktoken's
# gpt2 encoding, on the same text, in one run. Prints figures; not a test.
#   dev/tokenizer/bench.sh [TEXT] [SECONDS]      (or: make bench-tokenizer)
# Figures are from the fastest repetition of each (least disturbed by other load).
# Needs data_prep/bench_tokenize built and `npm ci` done in dev/tokenizer.
set -euo pipefail
cd "$(dirname "$0")/../.."
text=${1:-data/raw/moby_dick/moby_dick.txt}
secs=${2:-2}
[ -f "$text" ] || { echo "error: $text missing; fix: data_prep/fetch.sh tiny" >&2; exit 1; }
[ -x data_prep/bench_tokenize ] || { echo "error: data_prep/bench_tokenize missing; fix: make data_prep/bench_tokenize" >&2; exit 1; }
[ -d dev/tokenizer/node_modules/tiktoken ] || { echo "error: npm tiktoken missing; fix: (cd dev/tokenizer && npm ci)" >&2; exit 1; }

ours=$(data_prep/bench_tokenize --seconds "$secs" "$text")
theirs=$(node dev/tokenizer/bench_tiktoken.js "$text" "$secs")
# value of key=... in a line
get() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

o1=$(get "$ours" single_mbs); oa=$(get "$ours" all_mbs); th=$(get "$ours" threads)
t1=$(get "$theirs" single_mbs); ta=$(get "$theirs" all_mbs); tv=$(get "$theirs" version)
echo "text: $text ($(get "$ours" bytes) bytes), $(nproc) cores, $(date -u +%Y-%m-%d)"
printf '%-28s %14s %18s\n' "" "1 core MB/s" "all cores MB/s"
printf '%-28s %14s %18s\n' "ours (C, PCRE2 JIT)" "$o1" "$oa ($th threads)"
printf '%-28s %14s %18s\n' "npm tiktoken $tv (gpt2)" "$t1" "$ta ($(get "$theirs" threads) workers)"
printf '%-28s %13.2fx %17.2fx\n' "ours / tiktoken" "$(awk "BEGIN{print $o1/$t1}")" "$(awk "BEGIN{print $oa/$ta}")"
# the two must agree on what they produce
if [ "$(get "$ours" tokens)" != "$(get "$theirs" tokens)" ] || [ "$(get "$ours" chunk_tokens)" != "$(get "$theirs" chunk_tokens)" ]; then
  echo "warning: token counts differ: ours $(get "$ours" tokens)/$(get "$ours" chunk_tokens), tiktoken $(get "$theirs" tokens)/$(get "$theirs" chunk_tokens)"
else
  echo "token counts agree: $(get "$ours" tokens) (whole text), $(get "$ours" chunk_tokens) (chunked)"
fi
