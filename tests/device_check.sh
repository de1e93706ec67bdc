#!/bin/bash
# device_check.sh — every test on a GPU machine in one command: builds (autoreconf, configure, make), runs the whole
# make check, whose GPU tests run their multi-rank cases at 2 and 3 ranks where the node can run them (one rank per GPU,
# or several on one GPU through NCCL 2.30.3+ with NCCL_MULTI_RANK_GPU_ENABLE=1: ../shared/device/README.md), and prints
# a table of every test that ran on the GPU or was skipped: its passes, failures and skips, and the multi-rank GPU checks
# among them. Usage, on the device machine from the source folder: tests/device_check.sh [configure flags...]; the table
# and every test log go to $OUT (default ./device-check) as well. Exit status: that of make check.
set -u
out=${OUT:-./device-check}
mkdir -p "$out"
started=$(date +%s)
{ autoreconf -fi && ./configure "$@" && make -j"$(nproc)" && make tests/gpu_present; } > "$out/build.log" 2>&1 || {
    echo "device_check: the build failed (last lines of $out/build.log):" >&2; tail -20 "$out/build.log" >&2; exit 2; }
built=$(date +%s)
echo "# $(tests/gpu_present --why 2>&1 > /dev/null); GPU ranks the tests may start: $(tests/gpu_present)"
make check -j"$(nproc)" > "$out/check.log" 2>&1; status=$?
done_at=$(date +%s)
cp tests/*.log "$out/" 2> /dev/null
# the table: tests whose log names a GPU (a GPU check ran or was skipped for want of one)
{
    printf '%-34s %5s %5s %5s  %s\n' test pass fail skip "multi-rank GPU checks (passed/run)"
    for trs in tests/*.trs; do
        log=${trs%.trs}.log
        grep -qiE 'gpu|cuda|nccl' "$log" 2>/dev/null || continue
        pass=$(grep -c '^:test-result: PASS' "$trs"); fail=$(grep -c '^:test-result: \(FAIL\|ERROR\|XPASS\)' "$trs")
        skip=$(grep -c '^:test-result: SKIP' "$trs")
        multi_run=$(grep -E '^(not )?ok ' "$log" | grep -iE '([2-9]|two) GPU ranks?|GPU ranks? ' | grep -vc '# SKIP')
        multi_ok=$(grep -E '^ok ' "$log" | grep -iE '([2-9]|two) GPU ranks?|GPU ranks? ' | grep -vc '# SKIP')
        printf '%-34s %5d %5d %5d  %s\n' "${trs#tests/}" "$pass" "$fail" "$skip" "$multi_ok/$multi_run"
    done
    echo "build $((built - started)) s, make check $((done_at - built)) s; $(grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR):' "$out/check.log" | tr '\n' ' ')"
} | tee "$out/summary.txt"
exit $status
