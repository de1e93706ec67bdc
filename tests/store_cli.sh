#!/bin/sh
# store_cli.sh — aldit-store end to end: synth, info, verify (sound, truncated and corrupt stores, one written
# by h5py), pack from .npy files written with printf, --out paths that are not regular files, a full disk
# (a small tmpfs when it can be mounted, else a file size limit), and the exit statuses (0 ok, 1 bad store
# or data, 2 bad usage).
. "$top_srcdir/tests/tap.sh"
tool=./aldit-store
work=$(mktemp -d "$PWD/store_cli.tmp.XXXXXX") || exit 1
small=
trap '[ -n "$small" ] && umount "$small" 2>/dev/null; rm -rf "$work"' EXIT
spec="$top_srcdir/inputs/quickstart.lengths"

# npy NAME DESCR SHAPE BYTES: write a version-1 .npy file; BYTES is a printf format of the raw data.
npy() {
    header="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
    # pad with spaces so that 10 + header + newline is a multiple of 64, as numpy writes it
    length=$(( (${#header} + 11 + 63) / 64 * 64 - 10 ))
    { printf '\223NUMPY\001\000'
      printf "\\$(printf '%03o' $((length % 256)))\\$(printf '%03o' $((length / 256)))"
      printf '%-*s\n' $((length - 1)) "$header"
      printf "$4"; } > "$1"
}
one='\000\000\200\077'   # 1.0f little-endian
half='\000\074'          # 1.0 as float16

tap_plan 31
out=$($tool synth --spec "$spec" --samples 50 --out "$work/a.h5" --text-len 6 --text-dim 8 --seed 3 2>&1)
tap_result $? "synth writes a store" "$out"
tap_ok "no temporary file is left" test ! -e "$work/a.h5.tmp"
out=$($tool info "$work/a.h5" 2>&1); status=$?
tap_result $status "info exits 0" "$out"
tap_is "info counts the samples" "$(printf '%s\n' "$out" | grep -c '^samples      50 (')" 1
tap_is "info shows the token histogram" "$(printf '%s\n' "$out" | grep -c 'power-of-two bins')" 1
out=$($tool verify "$work/a.h5" 2>&1)
tap_result $? "verify of a sound store exits 0" "$out"

$tool synth --spec "$spec" --samples 50 --out "$work/b.h5" --text-len 6 --text-dim 8 --seed 3 --precision f32 >/dev/null 2>&1
cmp -s "$work/a.h5" "$work/b.h5"; tap_is "the precision option changes the store" "$?" 1
$tool synth --spec "$spec" --samples 50 --out "$work/c.h5" --text-len 6 --text-dim 8 --seed 3 >/dev/null 2>&1
$tool info "$work/a.h5" > "$work/a.info" 2>&1; $tool info "$work/c.h5" | sed "s|c\.h5|a.h5|" > "$work/c.info" 2>&1
tap_ok "synth is deterministic in the seed" cmp "$work/a.info" "$work/c.info"

cp "$work/a.h5" "$work/cut.h5"
truncate -s $(( $(wc -c < "$work/a.h5") / 2 )) "$work/cut.h5"
out=$($tool verify "$work/cut.h5" 2>&1); status=$?
tap_is "verify of a truncated store exits 1" "$status" 1
tap_result $(printf '%s\n' "$out" | grep -q "cut.h5: cannot open as HDF5 (truncated" && echo 0 || echo 1) \
    "verify names the truncated file" "$out"

$tool synth 2>/dev/null; tap_is "synth without options: exit 2" "$?" 2
$tool synth --spec "$spec" --samples many --out "$work/x.h5" 2>/dev/null; tap_is "a bad number: exit 2" "$?" 2
$tool frobnicate 2>/dev/null; tap_is "an unknown command: exit 2" "$?" 2
printf '1 1 4\n' > "$work/bad.lengths"
out=$($tool synth --spec "$work/bad.lengths" --samples 5 --out "$work/x.h5" 2>&1); status=$?
tap_is "a bad length spec: exit 2 with FILE:LINE" "$status:$(printf '%s\n' "$out" | grep -c 'bad.lengths:1: expected 4 or 5 fields')" "2:1"
$tool --help | grep -q '^usage: aldit-store'; tap_is "--help prints the usage" "$?" 0

mkdir "$work/npy"
npy "$work/npy/cat.npy" '<f4' '(2, 1, 2, 2)' "$one$one$one$one$one$one$one$one"
npy "$work/npy/cat.text.npy" '<f4' '(3, 2)' "$one$one$one$one$one$one"
npy "$work/npy/dog.npy" '<f2' '(2, 2, 2, 2)' "$half$half$half$half$half$half$half$half$half$half$half$half$half$half$half$half"
npy "$work/npy/dog.text.npy" '<f4' '(1, 2)' "$one$one"
out=$($tool pack --out "$work/p.h5" "$work/npy" 2>&1)
tap_result $? "pack builds a store from .npy files" "$out"
out=$($tool info "$work/p.h5" 2>&1)
tap_is "the packed store holds 1 image and 1 video" "$(printf '%s\n' "$out" | grep -c '^samples      2 (1 image, 1 video)')" 1
out=$($tool verify "$work/p.h5" 2>&1)
tap_result $? "the packed store verifies" "$out"

npy "$work/npy/eel.npy" '<f4' '(2, 1, 2, 2)' "$one$one$one$one$one$one$one$one"
out=$($tool pack --out "$work/q.h5" "$work/npy" 2>&1); status=$?
tap_is "pack with a missing text partner: exit 1 naming it" \
    "$status:$(printf '%s\n' "$out" | grep -c 'eel.npy: no text partner eel.text.npy')" "1:1"
npy "$work/npy/eel.text.npy" '<f4' '(1, 2)' "$one"
out=$($tool pack --out "$work/q.h5" "$work/npy" 2>&1); status=$?
tap_is "pack of a truncated .npy: exit 1 naming it, no store left" \
    "$status:$(printf '%s\n' "$out" | grep -c 'eel.text.npy: truncated'):$(ls "$work" | grep -c '^q\.h5')" "1:1:0"
out=$($tool verify "$top_srcdir/tests/decks/h5py_store.h5" 2>&1)
tap_result $? "a store written by h5py (fixed-length names, variable-length UTF-8 columns) verifies" "$out"
out=$($tool info --out "$work/x" "$work/a.h5" 2>&1); status=$?
tap_is "an option the command lacks: exit 2 naming it" "$status:$(printf '%s\n' "$out" | grep -c "unknown option '--out'")" "2:1"
out=$($tool synth --spec "$spec" --samples 2>&1); status=$?
tap_is "an option without its value: exit 2 naming it" "$status:$(printf '%s\n' "$out" | grep -c 'option --samples needs a value')" "2:1"
out=$($tool info -- "$work/a.h5" 2>&1)
tap_result $? "-- ends the options" "$out"

# --out must be a regular file or nothing: a directory, a symbolic link or a device is refused, untouched
mkdir "$work/dir.h5"
out=$($tool synth --spec "$spec" --samples 3 --text-dim 8 --out "$work/dir.h5" 2>&1); status=$?
tap_is "synth --out DIRECTORY: exit 1 naming it, the directory kept" \
    "$status:$(printf '%s\n' "$out" | grep -c 'dir.h5: exists and is a directory'):$(test -d "$work/dir.h5" && echo kept)" "1:1:kept"
ln -s a.h5 "$work/link.h5"
cp "$work/a.h5" "$work/a.copy"
out=$($tool pack --out "$work/link.h5" "$work/npy" 2>&1); status=$?
tap_is "pack --out SYMLINK: exit 1 naming it, link and target kept" \
    "$status:$(printf '%s\n' "$out" | grep -c 'link.h5: exists and is a symbolic link'):$(test -L "$work/link.h5" && cmp -s "$work/a.h5" "$work/a.copy" && echo kept)" \
    "1:1:kept"
# a device node of our own (never /dev/null itself: a writer without the check would rename over it)
if [ "$(id -u)" = 0 ] && mknod "$work/null" c 1 3 2>/dev/null; then
    out=$($tool synth --spec "$spec" --samples 3 --text-dim 8 --out "$work/null" 2>&1); status=$?
    tap_is "synth --out DEVICE: exit 1 naming it, still a device" \
        "$status:$(printf '%s\n' "$out" | grep -c 'null: exists and is a device'):$(test -c "$work/null" && echo kept)" "1:1:kept"
else
    mkfifo "$work/null"
    out=$($tool synth --spec "$spec" --samples 3 --text-dim 8 --out "$work/null" 2>&1); status=$?
    tap_is "synth --out FIFO: exit 1 naming it, still a FIFO" \
        "$status:$(printf '%s\n' "$out" | grep -c 'null: exists and is a named pipe'):$(test -p "$work/null" && echo kept)" "1:1:kept"
fi

# A store that does not fit: pack stops at the sample that does not fit, with errno's text naming the file,
# and leaves nothing behind (no HDF5 "infinite loop closing library").
mkdir "$work/big"
zeros=$((512 * 512 * 4))
npy "$work/big/s0.npy" '<f4' '(1, 1, 512, 512)' ''
head -c $zeros /dev/zero >> "$work/big/s0.npy"
npy "$work/big/s0.text.npy" '<f4' '(1, 2)' "$one$one"
for i in 1 2 3 4 5 6 7; do
    ln -s s0.npy "$work/big/s$i.npy"; ln -s s0.text.npy "$work/big/s$i.text.npy"
done
check_full() {  # check_full DIR NAME ERRNO-TEXT, after $out and $status of a pack into DIR
    tap_is "pack onto $2: exit 1 with errno's text naming the file" \
        "$status:$(printf '%s\n' "$out" | grep -c "full.h5.tmp: $3")" "1:1"
    tap_is "pack onto $2: no HDF5 close error, nothing left" \
        "$(printf '%s\n' "$out" | grep -c 'infinite loop'):$(ls "$1" | grep -c full)" "0:0"
}
mkdir "$work/small"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=2m tmpfs "$work/small" 2>/dev/null; then
    small="$work/small"
    out=$($tool pack --precision f32 --out "$small/full.h5" "$work/big" 2>&1); status=$?
    check_full "$small" "a full 2 MiB tmpfs" "No space left on device"
    umount "$small"; small=
else
    tap_result 0 "pack onto a full tmpfs # SKIP cannot mount a tmpfs here (not root?)"
    tap_result 0 "pack onto a full tmpfs # SKIP cannot mount a tmpfs here (not root?)"
fi
# the same through a file size limit (any user): 4096 blocks is 2 MiB in dash, 4 MiB in bash
out=$( (trap '' XFSZ; ulimit -f 4096 && exec $tool pack --precision f32 --out "$work/small/full.h5" "$work/big") 2>&1); status=$?
check_full "$work/small" "a 4096-block file size limit" "File too large"
tap_done
