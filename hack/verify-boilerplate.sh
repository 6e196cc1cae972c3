#!/usr/bin/env bash
# Fails when a Go file lacks the license header of hack/boilerplate.go.txt at its top:
# first in the file, or after its //go:build line and a blank line, where
# controller-gen writes it too. With file names, checks those; else every Go file
# that git tracks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
header=$(cat hack/boilerplate.go.txt)
if (($# == 0)); then
	mapfile -t files < <(git ls-files '*.go')
else
	files=("$@")
fi
missing=()
for f in "${files[@]}"; do
	top=$(head -n 20 "$f")
	if [[ $top == //go:build* ]]; then
		top=${top#*$'\n'}
		[[ $top == $'\n'* ]] && top=${top#$'\n'}
	fi
	[[ $top == "$header"* ]] || missing+=("$f")
done
if ((${#missing[@]} > 0)); then
	echo "license header missing (hack/boilerplate.go.txt, at the top or after //go:build and a blank line):"
	printf '%s\n' "${missing[@]}"
	exit 1
fi
