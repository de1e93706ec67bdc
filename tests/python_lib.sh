# python_lib.sh — for the tests of the Python tools: skip (TAP "1..0 # SKIP" under make check, exit 77 by hand)
# unless python3 imports the modules named; source it, then `python_needs torch diffusers h5py`.
. "${top_srcdir:-.}/tests/tap.sh"
PYTHON=${PYTHON:-python3}
python_needs() {
    missing=
    for module in "$@"; do
        "$PYTHON" -c "import $module" > /dev/null 2>&1 || missing="$missing $module"
    done
    [ -z "$missing" ] && return 0
    echo "1..0 # SKIP $PYTHON cannot import:$missing"
    [ "${CMOCKA_MESSAGE_OUTPUT:-}" = TAP ] && exit 0
    exit 77
}
