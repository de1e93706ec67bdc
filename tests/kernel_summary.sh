#!/bin/sh
# kernel_summary.sh — tools/kernel_summary.py on a small Nsight Compute raw CSV (milliseconds) and an Nsight Systems
# kernel summary CSV of the same kernels: the same kinds and milliseconds from both, the kinds' sums equal to the
# total, and a file of neither format refused with exit 1 naming it. Skipped without python3.
. "${top_srcdir:-.}/tests/tap.sh"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" > /dev/null 2>&1 || tap_skip_all "no $PYTHON"
tool="${top_srcdir:-.}/tools/kernel_summary.py"
work=$(mktemp -d /tmp/kernel_summary.XXXXXX) || exit 1
tap_plan 4

cat > "$work/ncu.csv" <<'CSV'
"ID","Kernel Name","gpu__time_duration.sum"
"","","ms"
"0","cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma","6.5"
"1","cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma","2.5"
"2","nvjet_sm90_tst_192x208_64x4_1x2_h_bz_coopB_bias_TNT","0.75"
"3","nvjet_sm90_tst_192x208_64x4_1x2_h_bz_coopB_bias_TNT","0.25"
"4","void <unnamed>::lnmod_bwd_kernel<64, 3, 1>(<unnamed>::BwdArgs)","0.125"
"5","<unnamed>::attention_bwd_delta_kernel(const unsigned short *)","0.0625"
"6","<unnamed>::patchify_flow_kernel(const float *)","0.0625"
CSV
cat > "$work/nsys.csv" <<'CSV'
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
63.9,6500000,1,6500000,6500000,6500000,6500000,0,cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma
24.6,2500000,1,2500000,2500000,2500000,2500000,0,cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma
9.8,1000000,2,500000,500000,250000,750000,0,nvjet_sm90_tst_192x208_64x4_1x2_h_bz_coopB_bias_TNT
1.2,125000,1,125000,125000,125000,125000,0,"void <unnamed>::lnmod_bwd_kernel<64, 3, 1>(<unnamed>::BwdArgs)"
0.6,62500,1,62500,62500,62500,62500,0,<unnamed>::attention_bwd_delta_kernel(const unsigned short *)
0.6,62500,1,62500,62500,62500,62500,0,<unnamed>::patchify_flow_kernel(const float *)
CSV
"$PYTHON" "$tool" "$work/ncu.csv" > "$work/ncu.out" 2>&1; ncu_status=$?
"$PYTHON" "$tool" "$work/nsys.csv" > "$work/nsys.out" 2>&1; nsys_status=$?
expected='kernels: 7 launches, 10.2 ms
| kind | ms | share |
|---|---|---|
| cuDNN attention | 9.0 | 87.8% |
| cuBLASLt GEMMs | 1.0 | 9.8% |
| LN-modulate | 0.1 | 1.2% |
| own attention | 0.1 | 0.6% |
| the rest | 0.1 | 0.6% |'
test "$ncu_status" = 0 -a "$(head -8 "$work/ncu.out")" = "$expected"
tap_result $? "ncu raw CSV: kinds, milliseconds and shares" "$(cat "$work/ncu.out")"
test "$nsys_status" = 0 -a "$(head -8 "$work/nsys.out")" = "$expected"
tap_result $? "nsys kernel summary CSV: the same table" "$(cat "$work/nsys.out")"
case $(sed -n 9,10p "$work/ncu.out") in *"6.50 ms      1  cudnn_generated_fort_native_sdpa_sm90_flash_bprop"*) found=0 ;; *) found=1 ;; esac
tap_result $found "the longest kernel listed first with its calls" "$(cat "$work/ncu.out")"
printf 'a,b\n1,2\n' > "$work/other.csv"
"$PYTHON" "$tool" "$work/other.csv" > "$work/other.out" 2>&1; status=$?
case $status:$(cat "$work/other.out") in 1:*"other.csv is neither"*) found=0 ;; *) found=1 ;; esac
tap_result $found "a CSV of neither format: exit 1 naming it" "exit $status; $(cat "$work/other.out")"
rm -rf "$work"
tap_done
