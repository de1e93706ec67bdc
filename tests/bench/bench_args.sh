#!/bin/sh
# bench_args.sh — make check's look at aldit-bench without running a measurement: --help, each bad value of the
# mmdit section's options (and --sections) refused with exit 2 and a message naming it, and the exit 1 saying so
# where no GPU is visible (skipped where one is: the bench is the lead's device call). As TAP.
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/tap.sh"
bench="$top_builddir/aldit-bench"
[ -x "$bench" ] || tap_skip_all "aldit-bench is built with CUDA only"
tap_plan 12

help=$("$bench" --help 2>&1); status=$?
case $help in *"mmdit:"*"--mmdit-cases"*"16x256:600"*) found=0 ;; *) found=1 ;; esac
tap_result $((status + found)) "aldit-bench --help describes the mmdit section and its default cases" "$help"

# refused: ARGS (word-split) and the text the message must hold
refused() {
    want=$1; shift
    text=$("$bench" "$@" 2>&1); status=$?
    case $text in *"$want"*) found=0 ;; *) found=1 ;; esac
    if [ $status = 2 ]; then tap_result $found "aldit-bench $*: exit 2, names '$want'" "$text"
    else tap_result 1 "aldit-bench $*: exit 2, names '$want'" "exit $status: $text"; fi
}
refused "unknown section foo (lnmod, gemm, attention, block, split, zeros, mmdit)" --sections mmdit,foo
refused "case 256 is not [Bx]S:L[:T2[:I]]" --mmdit-cases 256
refused "case 16x256:600:1:2:3 is not" --mmdit-cases 16x256:600:1:2:3
refused "case x256:10 is not" --mmdit-cases x256:10
refused "(video tokens S) 0: expected an integer from 1" --mmdit-cases 0:10
refused "(samples B) 300: expected an integer from 1 to 256" --mmdit-cases 300x256:10
refused "case 256x10000:10 has 2560000 video and 2560 caption rows" --mmdit-cases 256x10000:10
refused "at most 8 cases" --mmdit-cases 1:1,2:2,3:3,4:4,5:5,6:6,7:7,8:8,9:9
refused "--image-rows 99999: expected an integer from 0 to 16384" --image-rows 99999
refused "--text-rows 20000: the mmdit section takes at most 16384 Qwen rows" --sections mmdit --seq 256 --text-rows 20000

gpus=$("$top_builddir/tests/gpu_present" 2>/dev/null || echo 0)
if [ "${gpus:-0}" = 0 ]; then
    text=$("$bench" --sections mmdit --mmdit-cases 16x256:600:0:729 2>&1); status=$?
    case $text in *"no GPU visible"*) found=0 ;; *) found=1 ;; esac
    [ $status = 1 ] && tap_result $found "aldit-bench --sections mmdit without a GPU: exit 1, says so" "$text" ||
        tap_result 1 "aldit-bench --sections mmdit without a GPU: exit 1, says so" "exit $status: $text"
else
    TAP_COUNT=$((TAP_COUNT + 1)); echo "ok $TAP_COUNT # SKIP a GPU is visible: the bench is the lead's device call"
fi
tap_done
