#!/bin/sh
# peer_masks.sh — the training peer's key masks (tests/bench/peer_mmdit.py, key_masks) against diffusers' own joint
# masks: a toy HunyuanVideo15Transformer3DModel on the CPU, a text-to-video and an image-to-video batch of two samples
# whose Qwen and ByT5 captions pad 1 to 9 rows, the same weights; the loss and every parameter's gradient must agree
# to fp32 rounding. As TAP; skips where torch or diffusers do not import.
top_srcdir=${top_srcdir:-.}
PYTHON=${PYTHON:-python3}
. "$top_srcdir/tests/tap.sh"
"$PYTHON" -c "import torch, diffusers, h5py" > /dev/null 2>&1 || tap_skip_all "$PYTHON with torch, diffusers and h5py does not run"
out=$(BENCH_DIR="$top_srcdir/tests/bench" "$PYTHON" - 2>&1 <<'PY'
import os, sys
import torch
sys.path.insert(0, os.environ["BENCH_DIR"])
import peer_mmdit

dims = dict(dim=32, ffn_dim=64, num_heads=2, num_layers=2, in_dim=9, out_dim=4, patch_t=1, patch_h=1, patch_w=1,
            text_dim=12, text_2_dim=6, image_dim=10, rope_axes_t=4, text_len=16)
family = peer_mmdit.HunyuanFamily({"run.seed": "5", "train.timestep_shift": "3", "train.timesteps": "logit_normal",
                                   "train.i2v_share": "0.5"}, dims, "cpu")


def batch(i2v, seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g)
    samples = [{"text": r(11, 12), "text_2": r(2, 6), "image": r(3, 10), "i2v": i2v},
               {"text": r(3, 12), "text_2": r(5, 6), "image": r(3, 10), "i2v": i2v}]
    family.samples = samples
    x0, x_t = r(2, 4, 3, 4, 6), r(2, 4, 3, 4, 6)
    return [0, 1], x_t, x0, torch.tensor([0.3, 0.8]), r(*x0.shape)


def run(model, case):
    index, x_t, x0, sigma, target = case
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(family.forward(model, index, x_t, x0, sigma), target)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


torch.manual_seed(3)
reference = family.build(joint_masks=True)
with torch.no_grad():   # every parameter random, so that no path is trivially zero
    for p in reference.parameters():
        p.normal_(0.0, 0.3)
cases = [batch(False, 1), batch(True, 2)]
expected = [run(reference, c) for c in cases]
reduced = []   # the masks key_mask reduced, by (rows, keys): the 2 blocks' and 2 refiner blocks' of each batch
plain = peer_mmdit.key_mask
peer_mmdit.key_mask = lambda mask: reduced.append(tuple(mask.shape[-2:])) or plain(mask) if mask is not None else mask
keyed = family.build()
keyed.load_state_dict(reference.state_dict())
worst = 0.0
for (loss_a, grads_a), case in zip(expected, cases):
    loss_b, grads_b = run(keyed, case)
    worst = max(worst, abs(loss_a - loss_b) / abs(loss_a))
    if grads_a.keys() != grads_b.keys():
        sys.exit(f"the gradients' parameters differ: {sorted(grads_a.keys() ^ grads_b.keys())}")
    for name in grads_a:
        scale = float(grads_a[name].abs().max()) or 1.0
        worst = max(worst, float((grads_a[name] - grads_b[name]).abs().max()) / scale)
    if not all(torch.isfinite(g).all() for g in grads_b.values()):
        sys.exit("a key-masked gradient is not finite")
if len(reduced) != 4 * len(cases) or any(rows != keys for rows, keys in reduced):
    sys.exit(f"key_mask took {reduced}: expected the joint masks of 2 blocks and 2 refiner blocks per batch")
print(f"{len(cases)} batches, {len(reduced)} joint masks made key masks, {len(expected[0][1])} parameters: largest relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
PY
)
status=$?
tap_plan 1
tap_result $status "the peer's key masks train as diffusers' joint masks (loss, every gradient): $(echo "$out" | tail -n 1)" "$out"
tap_done
