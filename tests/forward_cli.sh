#!/bin/sh
# forward_cli.sh — aldit-forward on a checkpoint of a 2-step CPU run (no Python needed; the input file is made
# with h5import): the checkpoint's /model attributes against the deck (layers, heads, eps, qk_norm refused,
# naming both values), and --output: a directory, symbolic link or named pipe there (or at OUT.tmp) refused
# before any work, untouched and without a left-over OUT.tmp; a folder that does not exist named with errno.
. "${top_srcdir:-.}/tests/train_lib.sh"
forward="$top_builddir/aldit-forward"
command -v h5import > /dev/null 2>&1 || tap_skip_all "no h5import (Debian: hdf5-tools) to make the input file"
tap_plan 14

make_store > /dev/null 2>&1
run_aldit 1 run run.steps=2
checkpoint=$WORK/run/checkpoints/step_00000002.h5
tap_ok "aldit writes a checkpoint of the test deck's 2-layer model" test -f "$checkpoint"

# one sample: 1 latent frame of 4x4, 8 text tokens; in_dim 16, text_dim 16 (the test deck's)
printf '1 4 4 8\n' > "$WORK/shapes.txt"
awk 'BEGIN { for (i = 0; i < 256; i++) printf "%.5f\n", sin(0.37 * i) }' > "$WORK/latents.txt"
printf '0.5\n' > "$WORK/sigma.txt"
awk 'BEGIN { for (i = 0; i < 128; i++) printf "%.5f\n", cos(0.21 * i) }' > "$WORK/text.txt"
config() { printf 'PATH %s\nINPUT-CLASS %s\nINPUT-SIZE 32\nRANK %s\nDIMENSION-SIZES %s\nOUTPUT-CLASS %s\nOUTPUT-SIZE %s\n' "$@"; }
config shapes TEXTIN 2 "1 4" IN 64 > "$WORK/shapes.cfg"
config latents TEXTFP 1 256 FP 32 > "$WORK/latents.cfg"
config sigma TEXTFP 1 1 FP 32 > "$WORK/sigma.cfg"
config text TEXTFP 1 128 FP 32 > "$WORK/text.cfg"
for name in shapes latents sigma text; do set -- "$@" "$WORK/$name.txt" -c "$WORK/$name.cfg"; done
h5import "$@" -o "$WORK/input.h5" > "$WORK/h5import.log" 2>&1
tap_result $? "h5import makes the input file" "$(cat "$WORK/h5import.log")"

# forward OUTPUT [section.key=value ...]: the test deck's model on the checkpoint; log in $WORK/forward.log
forward() {
    output=$1; shift
    "$forward" --weights "$checkpoint" --input "$WORK/input.h5" --output "$output" --deck "$TRAIN_DECK" "$@" \
        > "$WORK/forward.log" 2>&1
}
forward "$WORK/out.h5"; status=$?
[ "$status" = 0 ] && [ -f "$WORK/out.h5" ] && [ ! -e "$WORK/out.h5.tmp" ]
tap_result $? "the deck the checkpoint was trained with: exit 0, the output written, no .tmp left" "$(cat "$WORK/forward.log")"

# refused: exit 2, the message names the key and both values, no output written
refused() {
    description=$1; expected=$2; shift 2
    rm -f "$WORK/other.h5"
    forward "$WORK/other.h5" "$@"; status=$?
    case "$status:$(cat "$WORK/forward.log")" in 2:*"checkpoint of another model: $expected"*) found=0 ;; *) found=1 ;; esac
    [ -e "$WORK/other.h5" ] && found=1
    tap_result $found "$description" "exit $status: $(cat "$WORK/forward.log")"
}
refused "a deck of 1 layer on a 2-layer checkpoint: exit 2 naming both" \
    "model.num_layers is 2 in the checkpoint, 1 in the deck" model.num_layers=1
refused "4 heads against the checkpoint's 2: exit 2 naming both" \
    "model.num_heads is 2 in the checkpoint, 4 in the deck" model.num_heads=4
refused "another eps: exit 2 naming both" "model.eps is 1e-06 in the checkpoint, 1e-05 in the deck" model.eps=1e-5
refused "qk_norm off against a checkpoint trained with it: exit 2 naming both" \
    "model.qk_norm is 1 in the checkpoint, 0 in the deck" model.qk_norm=off

# --output that is not a regular file: exit 2 naming what it is, left as it was, no OUT.tmp
printf 'keep me\n' > "$WORK/target"
ln -s "$WORK/target" "$WORK/link.h5"
forward "$WORK/link.h5"; status=$?
case "$status:$(cat "$WORK/forward.log")" in 2:*"link.h5 exists and is a symbolic link"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a symbolic link as --output: exit 2 saying so" "exit $status: $(cat "$WORK/forward.log")"
tap_ok "the link and its target are untouched, no .tmp left" \
    sh -c "test -L '$WORK/link.h5' && test \"\$(cat '$WORK/target')\" = 'keep me' && test ! -e '$WORK/link.h5.tmp'"
mkfifo "$WORK/pipe.h5"
forward "$WORK/pipe.h5"; status=$?
case "$status:$(cat "$WORK/forward.log")" in 2:*"pipe.h5 exists and is a named pipe"*) found=0 ;; *) found=1 ;; esac
[ -p "$WORK/pipe.h5" ] || found=1
tap_result $found "a named pipe as --output: exit 2 saying so, the pipe kept" \
    "exit $status: $(cat "$WORK/forward.log")"
mkdir "$WORK/folder.h5"
forward "$WORK/folder.h5"; status=$?
case "$status:$(cat "$WORK/forward.log")" in 2:*"folder.h5 exists and is a directory"*) found=0 ;; *) found=1 ;; esac
[ -e "$WORK/folder.h5.tmp" ] && found=1
tap_result $found \
    "a directory as --output: exit 2 saying so, no folder.h5.tmp left" "exit $status: $(cat "$WORK/forward.log")"
ln -s "$WORK/target" "$WORK/new.h5.tmp"
forward "$WORK/new.h5"; status=$?
case "$status:$(cat "$WORK/forward.log")" in 2:*"new.h5.tmp exists and is a symbolic link"*) found=0 ;; *) found=1 ;; esac
[ -L "$WORK/new.h5.tmp" ] || found=1
tap_result $found "a symbolic link at OUT.tmp: exit 2, the link kept" \
    "exit $status: $(cat "$WORK/forward.log")"
forward "$WORK/absent/out.h5"; status=$?
case "$status:$(cat "$WORK/forward.log")" in 1:*"absent/out.h5.tmp: cannot create: No such file or directory"*) found=0 ;;
    *) found=1 ;; esac
tap_result $found "--output in a folder that does not exist: exit 1 with errno's text" \
    "exit $status: $(cat "$WORK/forward.log")"
forward "$WORK/out.h5"
tap_result $? "a regular file as --output is replaced" "$(cat "$WORK/forward.log")"
tap_done
