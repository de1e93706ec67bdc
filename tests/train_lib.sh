# train_lib.sh — helpers the training tests source: test store, test deck, running aldit, reading losses.
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
. "$top_srcdir/tests/tap.sh"
MPIEXEC=${MPIEXEC:-mpirun}
ALDIT="$top_builddir/aldit"
TRAIN_DECK="$top_srcdir/tests/decks/train_small.ini"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/aldit-train-XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT

# make_store: 64 samples of 4 to 48 tokens, text 8-16 x 16, into $WORK/store.h5
make_store() {
    "$top_builddir/aldit-store" synth --spec "$top_srcdir/tests/decks/train_tiny.lengths" --samples 64 \
        --text-len 16 --text-dim 16 --seed 3 --out "$WORK/store.h5"
}

# run_aldit NP RUN [section.key=value ...]: train the test deck on NP ranks into $WORK/RUN (log $WORK/RUN.log)
run_aldit() {
    np=$1; run=$2; shift 2
    $MPIEXEC -np "$np" --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/$run" \
        "$@" > "$WORK/$run.log" 2>&1
}

# losses FILE: one "step loss" line per metrics line, the loss exactly as written (%.17g)
losses() { sed -n 's/^{"step": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"; }

# compare A B TOLERANCE FIRST LAST: per-step relative difference of two loss files over steps FIRST..LAST;
# prints the largest difference; fails on a step over TOLERANCE, a missing step or a non-finite loss
compare() {
    paste "$1" "$2" | awk -v tol="$3" -v first="$4" -v last="$5" '
        $1 < first || $1 > last { next }
        { n++
          if ($1 != $3 || $2 !~ /^[0-9.eE+-]+$/ || $4 !~ /^[0-9.eE+-]+$/) { print "bad line: " $0; bad = 1; next }
          d = $2 - $4; if (d < 0) d = -d; m = $2 < 0 ? -$2 : $2; rel = d / m
          if (rel > tol) { print "step " $1 ": " $2 " vs " $4 " (" rel ")"; bad = 1 }
          if (rel > worst) worst = rel }
        END { if (n != last - first + 1) { print "steps compared: " n; bad = 1 }
              printf "%.2g\n", worst; exit bad }'
}

# run_pids RUN LAUNCHER: the aldit processes (but LAUNCHER) whose command line names run.dir=$WORK/RUN: the
# ranks. Only processes named aldit are read further (the shell's read: a scan forks for them alone).
run_pids() {
    for proc in /proc/[0-9]*; do
        pid=${proc#/proc/}
        [ "$pid" = "$2" ] && continue
        read -r name 2>/dev/null < "$proc/comm" || continue
        [ "$name" = aldit ] || continue
        tr '\000' ' ' 2>/dev/null < "$proc/cmdline" | grep -q -- "run.dir=$WORK/$1 " && printf '%s ' "$pid"
    done
}

# metrics_lines RUN: lines in $WORK/RUN/metrics.jsonl (0 if absent)
metrics_lines() { if [ -f "$WORK/$1/metrics.jsonl" ]; then wc -l < "$WORK/$1/metrics.jsonl" | tr -d ' '; else echo 0; fi; }

# rank_pid RUN LAUNCHER RANK: the pid of that MPI rank of the run (Open MPI's OMPI_COMM_WORLD_RANK in its environment)
rank_pid() {
    for pid in $(run_pids "$1" "$2"); do
        tr '\000' '\n' 2>/dev/null < "/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$3" && { echo "$pid"; return; }
    done
}

# start_aldit NP RUN [section.key=value ...]: run_aldit in the background; the launcher's pid in $launcher
start_aldit() {
    np=$1; run=$2; shift 2
    $MPIEXEC -np "$np" --oversubscribe "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" run.dir="$WORK/$run" \
        "$@" > "$WORK/$run.log" 2>&1 &
    launcher=$!
}

# wait_for SECONDS COMMAND...: poll every 0.02 s until COMMAND succeeds (0) or SECONDS pass (1)
wait_for() {
    polls=$(($1 * 50)); shift
    while ! "$@"; do
        polls=$((polls - 1))
        [ $polls -gt 0 ] || return 1
        sleep 0.02
    done
}

# has_lines RUN N: $WORK/RUN/metrics.jsonl has at least N lines
has_lines() { [ "$(metrics_lines "$1")" -ge "$2" ]; }

# whole_lines FILE: every line of FILE is a complete metrics line ('{' ... '}', ending in a newline)
whole_lines() {
    [ ! -s "$1" ] || [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" = '\n' ] || return 1
    ! grep -qv '^{"step": [0-9]*,.*}$' "$1"
}
