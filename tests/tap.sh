# tap.sh — TAP helpers for the shell tests; source it: `. "$top_srcdir/tests/tap.sh"`.
# tap_plan N; tap_ok "name" COMMAND...; tap_is "name" GOT WANT; tap_skip_all "reason"; tap_done.
# Each check prints `ok N - name` or `not ok N - name` with the evidence; tap_done exits 1 if any failed.
TAP_COUNT=0
TAP_FAILED=0
tap_plan() { echo "1..$1"; }
tap_skip_all() { echo "1..0 # SKIP $1"; exit 0; }
tap_result() {  # tap_result STATUS NAME [DETAIL]
    TAP_COUNT=$((TAP_COUNT + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $TAP_COUNT - $2"
    else
        TAP_FAILED=$((TAP_FAILED + 1))
        echo "not ok $TAP_COUNT - $2"
        [ -n "${3:-}" ] && printf '%s\n' "$3" | sed 's/^/# /'
    fi
    return 0
}
tap_ok() {  # tap_ok NAME COMMAND... : passes when COMMAND exits 0
    name=$1; shift
    out=$("$@" 2>&1); status=$?
    tap_result "$status" "$name" "$out"
}
tap_is() {  # tap_is NAME GOT WANT
    if [ "$2" = "$3" ]; then tap_result 0 "$1"; else tap_result 1 "$1" "got '$2', want '$3'"; fi
}
tap_done() { [ "$TAP_FAILED" -eq 0 ] || exit 1; exit 0; }
