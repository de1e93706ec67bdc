#!/bin/sh
# safetensors_diffusers.sh — aldit-export's folders in diffusers (tests/safetensors_diffusers.py): a random Wan model's
# weights exported as diffusers safetensors load with WanTransformer3DModel.from_pretrained and its forward equals
# aldit-forward's within 1e-5; the Wan export holds the HDF5 file's names and values to the bit (fp32); folders that
# diffusers' save_pretrained writes (whole and sharded with its index) read back by aldit as [model] init with the
# same output to the bit. Skips where torch, diffusers, safetensors or h5py do not import.
. "${top_srcdir:-.}/tests/python_lib.sh"
python_needs torch diffusers safetensors h5py numpy
work=$(mktemp -d "$PWD/safetensors_diffusers.tmp.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
helper() { "$PYTHON" "$top_srcdir/tests/safetensors_diffusers.py" "$@"; }
dims="model.dim=32 model.ffn_dim=64 model.num_heads=2 model.num_layers=2 model.in_dim=16 model.out_dim=16 model.text_len=16 model.text_dim=24 model.freq_dim=32"
st=diffusion_pytorch_model.safetensors
tap_plan 7

# weights.h5 (Wan names), input.h5 and aldit-forward's output.h5 of a random model, as tests/wan_parity.sh makes them
out=$("$PYTHON" "$top_srcdir/tools/wan_parity.py" --aldit-forward "$top_builddir/aldit-forward" --keep "$work/a" 2>&1)
tap_result $? "tools/wan_parity.py: aldit-forward on the random weights within 1e-5 of diffusers" "$out"

# shellcheck disable=SC2086
out=$("$top_builddir/aldit-export" "$work/a/weights.h5" --format diffusers --out "$work/diff" $dims 2>&1 &&
      "$top_builddir/aldit-export" "$work/a/weights.h5" --format wan --out "$work/wan" $dims 2>&1)
tap_result $? "aldit-export of the weights as diffusers and as Wan" "$out"

out=$(helper forward "$work/diff" "$work/a/input.h5" "$work/a/output.h5" --text-len 16 2>&1)
tap_result $? "WanTransformer3DModel.from_pretrained(the diffusers folder): forward within 1e-5 of aldit-forward's" "$out"

out=$(helper same "$work/wan/$st" "$work/a/weights.h5" 2>&1)
tap_result $? "the Wan export: the HDF5 file's names and fp32 values to the bit" "$out"

# diffusers writes the folder itself (whole, then sharded): aldit reads each as [model] init
out=$(helper resave "$work/diff" "$work/resaved" 2>&1 && helper resave "$work/diff" "$work/resharded" --shard-kb 20 2>&1)
tap_result $? "diffusers' save_pretrained of the loaded model, whole and in 20 KB shards" "$out"
for weights in "$work/resaved/$st" "$work/resharded/$st.index.json"; do
    name=$(basename "$(dirname "$weights")")
    # shellcheck disable=SC2086
    out=$("$top_builddir/aldit-forward" --weights "$weights" --input "$work/a/input.h5" --output "$work/$name.h5" \
          $dims 2>&1) && out=$(h5diff "$work/a/output.h5" "$work/$name.h5" output 2>&1)
    tap_result $? "aldit-forward on diffusers' $name folder ($(basename "$weights")): the same output to the bit" "$out"
done
tap_done
