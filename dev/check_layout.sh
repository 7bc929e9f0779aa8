#!/usr/bin/env bash
# dev/check_layout.sh: the repository's layout rules, one line per violation, exit 1 on any.
#   - train_mhar.cu holds the model only: no kernel (__global__: kernels/<op>.cuh) and no
#     getenv (no run-time switches: each op picks its kernel by shape and precision).
#   - no tracked text file names a folder beside the checkout (the team's shared folder, one
#     level up) or a path of the development machine (its workspace root): the repository
#     must stand on its own.
# Run by `make test`; takes no arguments. Without git (a copy of the tree), every file
# under the root but .git is checked.
set -u
cd "$(dirname "$0")/.." || exit 2
self=dev/check_layout.sh
bad=0
report() { echo "check_layout: $1"; bad=$((bad + 1)); }

while IFS= read -r hit; do
    report "train_mhar.cu:${hit%%:*}: ${hit#*:} (kernels go in kernels/<op>.cuh; no run-time switches)"
done < <(grep -nE '__global__|getenv' train_mhar.cu)

# the patterns are built from pieces, so that this file does not match itself either
shared_pat='\.\./'"shared"
machine_pat='/'"work"'/'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    list() { git ls-files -z; }
else
    list() { find . -type f -not -path './.git/*' -printf '%P\0'; }
fi
while IFS= read -r hit; do
    file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
    report "$file:$line: names a folder outside the repository (${shared_pat//\\/} or ${machine_pat}...): make it a path inside the repository"
done < <(list | grep -zv "^$self\$" | xargs -0 -r grep -nIE -e "$shared_pat" -e "$machine_pat" -- 2>/dev/null)

if [ "$bad" -ne 0 ]; then
    echo "check_layout: FAIL ($bad violations)"
    exit 1
fi
echo "check_layout: PASS (train_mhar.cu has no kernel and no getenv; no tracked file names a path outside the repository)"
