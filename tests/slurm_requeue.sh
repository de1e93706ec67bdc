#!/bin/sh
# slurm_requeue.sh — jobs/aldit.slurm under a real Slurm started here (munged, slurmctld, slurmd on this machine):
# a time limit whose USR1 warning fires mid-run; the job checkpoints, requeues itself, resumes and ends with
# per-step losses bit-identical to an uninterrupted run. Skipped where Slurm or munge is absent or cannot start.
. "${top_srcdir:-.}/tests/train_lib.sh"
SRC=$(cd "$top_srcdir" && pwd)
BUILD=$(cd "$top_builddir" && pwd)
JOB_WAIT_S=300    # the job, all its segments included, must be done by then

for tool in munged slurmctld slurmd sbatch scontrol squeue sinfo srun; do
    command -v $tool > /dev/null 2>&1 || tap_skip_all "$tool not found (Debian: apt-get install slurm-wlm munge)"
done
[ "$(id -u)" = 0 ] || tap_skip_all "starting slurmd needs root"

# ---- the daemons: config, key, state and logs under $WORK; every one is stopped on exit ----------------------
S="$WORK/slurm"
mkdir -p "$S/munge" "$S/state" "$S/spool" "$S/log" && chmod 700 "$S/munge"
HOST=$(uname -n | cut -d. -f1)
PORT=$((20000 + $$ % 20000 * 2))   # two ports of our own: another test's Slurm may run beside this one
CPUS=$(nproc 2> /dev/null || echo 2); [ "$CPUS" -ge 2 ] || CPUS=2
export SLURM_CONF="$S/slurm.conf"
cat > "$SLURM_CONF" << EOF
ClusterName=aldit-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/socket
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
# debug2 logs each time-limit check ("Testing job time limits"): the test times its submission by them
SlurmctldDebug=debug2
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

daemon_pids=
job=
stop_slurm() {
    if [ -n "$job" ]; then
        scancel "$job" 2> /dev/null
        n=0
        while [ $n -lt 40 ] && squeue -h -j "$job" 2> /dev/null | grep -q .; do sleep 0.25; n=$((n + 1)); done
    fi
    ranks=$(run_pids job 0)
    [ -n "$ranks" ] && kill -KILL $ranks 2> /dev/null
    for pid in $daemon_pids; do kill -TERM "$pid" 2> /dev/null; done
    n=0
    while [ $n -lt 40 ] && alive $daemon_pids; do sleep 0.25; n=$((n + 1)); done
    for pid in $daemon_pids; do kill -KILL "$pid" 2> /dev/null; done
    for pid in $daemon_pids; do wait "$pid" 2> /dev/null; done
}
alive() { for pid in "$@"; do kill -0 "$pid" 2> /dev/null && return 0; done; return 1; }
trap 'stop_slurm; [ -n "${ALDIT_TEST_KEEP:-}" ] || rm -rf "$WORK"' EXIT
trap 'exit 1' INT TERM HUP
# wait_for SECONDS COMMAND...: poll COMMAND every 0.25 s until it succeeds; fails after SECONDS
wait_for() {
    limit=$(($1 * 4)); shift; n=0
    until "$@" > /dev/null 2>&1; do
        n=$((n + 1)); [ $n -lt $limit ] || return 1
        sleep 0.25
    done
}
skip_start() {  # skip_start WHAT LOG: the daemon could not start in this sandbox
    echo "# $1 did not start; the end of $2:"
    tail -5 "$2" 2> /dev/null | sed 's/^/#   /'
    tap_skip_all "$1 could not start here"
}

dd if=/dev/urandom of="$S/munge/munge.key" bs=1024 count=1 2> /dev/null && chmod 400 "$S/munge/munge.key"
munged --foreground --force --socket="$S/munge/socket" --key-file="$S/munge/munge.key" \
    --log-file="$S/log/munged.log" --pid-file="$S/munge/munged.pid" --seed-file="$S/munge/seed" \
    > "$S/log/munged.out" 2>&1 &
daemon_pids="$!"
munge_ok() { munge -n -S "$S/munge/socket" | unmunge -S "$S/munge/socket"; }
wait_for 10 munge_ok || skip_start munged "$S/log/munged.log"
slurmctld -D -c -f "$SLURM_CONF" > "$S/log/slurmctld.out" 2>&1 &
daemon_pids="$daemon_pids $!"
ctld_ok() { scontrol ping | grep -q UP; }
wait_for 20 ctld_ok || skip_start slurmctld "$S/log/slurmctld.log"
slurmd -D -f "$SLURM_CONF" -N "$HOST" > "$S/log/slurmd.out" 2>&1 &
daemon_pids="$daemon_pids $!"
node_idle() { sinfo -h -n "$HOST" -o %t | grep -q '^idle'; }
wait_for 20 node_idle || skip_start slurmd "$S/log/slurmd.log"

# srun starts the ranks where Slurm has PMIx (Debian's has), else mpirun inside the allocation
LAUNCHER=mpirun; LAUNCH_ARGS=
srun --mpi=list 2>&1 | grep -q pmix && { LAUNCHER=srun; LAUNCH_ARGS=--mpi=pmix; }
[ "${ALDIT_TEST_LAUNCHER:-}" = mpirun ] && { LAUNCHER=mpirun; LAUNCH_ARGS=; }   # to try the other launcher

tap_plan 10
tap_ok "munged, slurmctld and slurmd run; node $HOST is idle" node_idle
tap_ok "aldit-store synth makes the test store" make_store

# ---- when to submit: --time=1 with the warning 60 s before the end warns at slurmctld's first time-limit check
# after the start (the checks come every 30 s). Submitting 18 s after a check lets aldit run about 10 s before
# the warning; a resumed segment still running at the next check is warned again, which only adds a requeue.
checks() { grep -c 'Testing job time limits' "$S/log/slurmctld.log"; }
next_check() {  # next_check: wait for slurmctld's next time-limit check; print its time (s)
    seen=$(checks)
    wait_for 40 new_check && date +%s
}
new_check() { [ "$(checks)" -gt "$seen" ]; }

# ---- the run's length: about TARGET_S seconds at the speed measured here, so the warning lands mid-run --------
TARGET_S=25
# timed under the job's launcher: srun's ranks poll at full speed, mpirun's yield when it oversubscribes
time_run() {
    if [ $LAUNCHER = srun ]; then
        srun $LAUNCH_ARGS --ntasks=2 --cpus-per-task=1 "$ALDIT" "$TRAIN_DECK" data.store="$WORK/store.h5" \
            run.dir="$WORK/timing" run.steps=200 balance.global_batch=16 > "$WORK/timing.log" 2>&1
    else
        run_aldit 2 timing run.steps=200 balance.global_batch=16
    fi
}
time_run &
timing=$!
checked=$(next_check)
wait $timing
# the steps of TARGET_S seconds at the fast quartile of step_s over steps 51 to 200 (start-up excluded): make check
# runs other tests beside this one, so the timing run may be slowed by them while the job later runs alone; timed
# by its faster steps the job lasts at least about TARGET_S s (longer under load: more segments, JOB_WAIT_S)
STEPS=$(sed -n 's/^{"step": \([0-9]*\),.*"step_s": \([^,]*\),.*/\1 \2/p' "$WORK/timing/metrics.jsonl" |
    awk '$1 > 50 { print $2 }' | sort -g |
    awk -v target=$TARGET_S '{ t[++n] = $1 }
        END { q = n ? t[int((n + 3) / 4)] : 0; s = q > 0 ? int(target / q) : 0
              if (s < 300) s = 300; if (s > 40000) s = 40000; print s }')
echo "# $STEPS steps for the job: about $TARGET_S s at the speed of a 200-step run here"
# The uninterrupted run goes first, alone: ranks beyond the cores slow Open MPI's polling all-reduce manyfold.
run_aldit 2 whole run.steps=$STEPS balance.global_batch=16; whole_status=$?
[ "$(date +%s)" -lt $((${checked:-0} + 16)) ] || checked=$(next_check)
while [ "$(date +%s)" -lt $((${checked:-0} + 18)) ]; do sleep 0.25; done
job=$(cd "$WORK" && ALDIT="$BUILD/aldit" ALDIT_RUN_DIR="$WORK/job" ALDIT_STORE="$WORK/store.h5" \
    ALDIT_LAUNCHER=$LAUNCHER ALDIT_LAUNCH_ARGS=$LAUNCH_ARGS sbatch --parsable --time=1 --signal=B:USR1@60 --requeue --ntasks-per-node=2 \
    --cpus-per-task=1 --gpus-per-node=0 --output="$WORK/job.out" "$SRC/jobs/aldit.slurm" "$SRC/tests/decks/train_small.ini" \
    run.steps=$STEPS balance.global_batch=16 2> "$WORK/sbatch.err")
tap_result $? "sbatch takes jobs/aldit.slurm (job $job, $LAUNCHER, $STEPS steps)" "$(cat "$WORK/sbatch.err")"

# A requeued job waits two minutes before it is eligible again; the test lets it start sooner, once its node
# is idle and two seconds have passed: slurmd refuses a launch whose credential dates from the second in which
# it revoked the last run's.
field() { scontrol show job "$job" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
deadline=$(($(date +%s) + JOB_WAIT_S))
state=
pending_since=
while [ "$(date +%s)" -lt $deadline ]; do
    state=$(field JobState)
    case $state in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;;
        PENDING)
            if [ "$(field Reason)" = BeginTime ]; then
                [ -n "$pending_since" ] || pending_since=$(date +%s)
                [ "$(date +%s)" -ge $((pending_since + 2)) ] && node_idle &&
                    scontrol update JobId="$job" StartTime=now
            fi ;;
        *) pending_since= ;;
    esac
    sleep 0.5
done
got="$state $(field ExitCode)"
test "$got" = "COMPLETED 0:0"
tap_result $? "the job completed (exit code 0:0)" "got '$got'; the daemons' logs end with:
$(tail -20 "$S/log/slurmctld.log" | grep -v debug2; tail -10 "$S/log/slurmd.log")"
restarts=$(field Restarts)
test "${restarts:-0}" -ge 1
tap_result $? "the USR1 warning fired mid-run and the job requeued itself ($restarts restarts)" "$(cat "$WORK/job.out")"
grep -q "requeueing job $job" "$WORK/job.out" && grep -q "^aldit.slurm: job $job start $restarts" "$WORK/job.out"
tap_result $? "each segment but the last checkpointed and requeued; the last one ran" "$(cat "$WORK/job.out")"
resumes=$(grep -c "resumed .*step_[0-9]*\.h5 at step [1-9]" "$WORK/job.out")
tap_is "every restart resumed from a checkpoint of its own run" "$resumes" "$restarts"

tap_is "the uninterrupted run exits 0" "$whole_status" 0
losses "$WORK/whole/metrics.jsonl" > "$WORK/whole.losses"
losses "$WORK/job/metrics.jsonl" > "$WORK/job.losses"
test "$(wc -l < "$WORK/whole.losses")" -eq $STEPS && cmp -s "$WORK/whole.losses" "$WORK/job.losses"
tap_result $? "per-step losses bit-identical to the uninterrupted run" \
    "$(diff "$WORK/whole.losses" "$WORK/job.losses" | head -10)"
stop_slurm
alive $daemon_pids $(run_pids job 0)
tap_result $((1 - $?)) "every daemon and rank the test started has exited"
daemon_pids=; job=
tap_done
