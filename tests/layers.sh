#!/bin/sh
# tests/layers.sh — the source folders are layers: every #include "..." of a file points into its own folder or a lower layer (docs/architecture.md).
# Order, lowest first; folders of one rank may not include each other.
srcdir=${top_srcdir:-.}
rank_of() {
    case "$1" in
        core) echo 0 ;; deck|io) echo 1 ;; model) echo 2 ;; balance) echo 3 ;; backend) echo 4 ;;
        cuda) echo 5 ;; train) echo 6 ;; programs) echo 7 ;; *) echo "" ;;
    esac
}
echo "1..1"
bad=0
cd "$srcdir" || exit 1
for file in src/*/*.c src/*/*.h io/*.c io/*.h cuda/*.c cuda/*.h cuda/*.cu cuda/*.cuh; do
    [ -f "$file" ] || continue
    case "$file" in src/*) folder=$(echo "$file" | cut -d/ -f2) ;; *) folder=$(echo "$file" | cut -d/ -f1) ;; esac
    mine=$(rank_of "$folder")
    if [ -z "$mine" ]; then echo "# $file: folder $folder is not a known layer (add it to tests/layers.sh and docs/architecture.md)"; bad=1; continue; fi
    for included in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file"); do
        case "$included" in config.h) continue ;; */*) ;; *) echo "# $file: #include \"$included\" names no layer folder"; bad=1; continue ;; esac
        target=${included%%/*}
        theirs=$(rank_of "$target")
        if [ -z "$theirs" ]; then echo "# $file: #include \"$included\": $target is not a layer"; bad=1
        elif [ "$target" != "$folder" ] && [ "$theirs" -ge "$mine" ]; then
            echo "# $file (layer $folder) includes $included (layer $target): includes must point down"; bad=1
        fi
    done
done
if [ "$bad" = 0 ]; then echo "ok 1 - every include points into its own layer or a lower one"; else echo "not ok 1 - an include points up or sideways"; fi
