"""peer_mmdit.py — the HunyuanVideo-1.5 family of tests/bench/peer_train.py (model.family = hunyuanvideo15):
diffusers' HunyuanVideo15Transformer3DModel with the deck's [model] dims (tools/hunyuan_parity.py's config), each sample's
timestep and task drawn as aldit draws them, and each batch given to the model as its pipeline gives it.

The draws: aldit's own (tests/bench/aldit_draws.py), so both runs train every sample at the same timestep and task;
the noise itself is drawn by torch (the same law, other numbers).

The batch: samples of one bucket, (video shape, image rows of an image-to-video sample or 0): diffusers' model treats
a batch as text-to-video or image-to-video as a whole (image rows all zero or none); B = bucket_tokens // (S +
text_len), the joint length of a sample with the longest caption. The input has 2C + 1 channels:
x_t, then zeros (text-to-video) or the first latent frame of x0 and a mask of ones on it (image-to-video), as aldit's
CPU model builds it (src/model/mmdit.c, put_condition). Qwen and ByT5 rows are padded with zeros to the longest of the
batch (at least one row) with their attention masks; image rows as stored (image-to-video; every row valid) or one
zero row (text-to-video, which the model masks out). The model takes timestep 1000 sigma; the loss is the mean square
error of its output against noise - x0.

Attention masks: diffusers builds each joint attention's mask as (row valid) & (key valid), [B, 1, N, N], so the query
of a padded caption row has every key masked, and batches that pad many rows gave the peer a NaN gradient on the
H200 (docs/PERFORMANCE.md, the HunyuanVideo-1.5 comparison). key_masks
(the default; build(joint_masks=True) keeps diffusers' own) gives the blocks' joint attention and the token refiner's
self-attention the key mask alone, [B, 1, 1, N]: a padded row's query then attends to the valid keys, so no row is
fully masked; every valid row's value, the loss and every gradient are unchanged (a padded row is never a valid
row's key, and its own output never reaches the loss: tests/bench/peer_masks.sh checks it on the CPU), and no N x N
mask is read by the attention.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from aldit_draws import AlditDraws  # noqa: E402  (aldit's per-sample timestep and task draws)
import hunyuan_parity  # noqa: E402  (HunyuanVideo15Transformer3DModel's config for aldit's dims)

def padded(rows, width, device):
    """Rows of each sample zero-padded to the longest (at least one row), and their mask (1: a row of the sample)."""
    longest = max(1, max(r.shape[0] for r in rows))
    values = torch.zeros(len(rows), longest, width, device=device)
    mask = torch.zeros(len(rows), longest, dtype=torch.int64, device=device)
    for i, r in enumerate(rows):
        values[i, :r.shape[0]] = r
        mask[i, :r.shape[0]] = 1
    return values, mask


def key_mask(mask):
    """The key mask of a joint [B, 1, N, N] boolean mask (row valid & key valid): its first row, [B, 1, 1, N]. The
    first row is valid in every mask this model builds (a video token in the blocks, a sample's first caption token
    in the refiner, where a caption has at least one row)."""
    if mask is not None and mask.dim() == 4 and mask.shape[-2] == mask.shape[-1] and mask.shape[-2] > 1:
        return mask[:, :, :1, :]
    return mask


class KeyMaskProcessor:
    """An attention processor that hands its inner processor the key mask of the joint mask it is given."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        return self.inner(attn, hidden_states, encoder_hidden_states, key_mask(attention_mask), *args, **kwargs)


def key_masks(model):
    """The model's attentions with key masks only (the module docstring says why): the dual-stream blocks through
    the diffusers module's attention dispatch (their processor builds the joint mask itself; the patch holds for
    every model of the process), the refiner's through its processors."""
    import diffusers.models.transformers.transformer_hunyuan_video15 as hv

    if not getattr(hv.dispatch_attention_fn, "key_masks", False):
        dispatch = hv.dispatch_attention_fn

        def keyed(query, key, value, attn_mask=None, **kwargs):
            return dispatch(query, key, value, attn_mask=key_mask(attn_mask), **kwargs)

        keyed.key_masks = True
        hv.dispatch_attention_fn = keyed
    for block in model.context_embedder.token_refiner.refiner_blocks:
        block.attn.set_processor(KeyMaskProcessor(block.attn.processor))


class HunyuanFamily:
    name = "diffusers HunyuanVideo15Transformer3DModel"

    def __init__(self, deck, dims, device):
        self.deck, self.dims, self.device = deck, dims, device
        self.draws = AlditDraws(deck)

    def latent_channels(self):
        return self.dims["out_dim"]

    def check(self, deck):
        if deck["model.text_padding"] != "trim":
            return "model.family = hunyuanvideo15 takes captions at their own lengths (model.text_padding = trim)"
        return None

    def build(self, joint_masks=False):
        from diffusers import HunyuanVideo15Transformer3DModel

        import diffusers.models.transformers.transformer_hunyuan_video15 as hv

        if joint_masks and getattr(hv.dispatch_attention_fn, "key_masks", False):
            raise RuntimeError("peer_mmdit: diffusers' joint masks asked for after key_masks patched this process")
        model = HunyuanVideo15Transformer3DModel(**hunyuan_parity.diffusers_config(self.dims))
        if not joint_masks:
            key_masks(model)
        return model

    @staticmethod
    def blocks(model):
        return model.transformer_blocks

    @staticmethod
    def set_blocks(model, blocks):
        model.transformer_blocks = blocks

    def prepare(self, samples):
        """Each sample's draws of epoch 0 (sigma, task), its bucket and the text rows aldit's model takes."""
        self.samples = samples
        for s in samples:
            eligible = s["shape"][0] > 1 and s["image"].shape[0] > 0
            s["i2v"] = self.draws.i2v(0, s["id"], eligible)
            s["sigma"] = self.draws.sigma(0, s["id"])
            image_rows = s["image"].shape[0] if s["i2v"] else 0
            s["bucket"] = (s["shape"], image_rows)
            s["bucket_rows"] = s["tokens"] + self.dims["text_len"]   # the joint rows of the longest caption
            s["text_rows"] = s["text_len"] + s["text_2"].shape[0] + image_rows

    def sigmas(self, batch, generator):
        values = [self.samples[i]["sigma"] for i in batch]
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def forward(self, model, batch, x_t, x0, sigma):
        group = [self.samples[i] for i in batch]
        C = self.dims["out_dim"]
        inputs = torch.zeros(x_t.shape[0], 2 * C + 1, *x_t.shape[2:], device=self.device)
        inputs[:, :C] = x_t
        i2v = group[0]["i2v"]
        if i2v:   # the condition: x0's first latent frame, and a mask of ones there
            inputs[:, C:2 * C, 0] = x0[:, :, 0]
            inputs[:, 2 * C, 0] = 1.0
        qwen, qwen_mask = padded([s["text"] for s in group], self.dims["text_dim"], self.device)
        byt5, byt5_mask = padded([s["text_2"] for s in group], self.dims["text_2_dim"], self.device)
        if i2v:
            image = torch.stack([s["image"] for s in group])
        else:   # text-to-video: one zero row, masked out by the model
            image = torch.zeros(len(group), 1, self.dims["image_dim"], device=self.device)
        return model(hidden_states=inputs, timestep=1000.0 * sigma, encoder_hidden_states=qwen,
                     encoder_attention_mask=qwen_mask, encoder_hidden_states_2=byt5,
                     encoder_attention_mask_2=byt5_mask, image_embeds=image, return_dict=False)[0]
