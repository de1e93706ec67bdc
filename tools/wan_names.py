"""wan_names.py — Wan 2.1's official parameter names (aldit's checkpoints) and diffusers' WanTransformer3DModel names.

aldit's checkpoints and [model] init files name every parameter as Wan's own `WanModel.state_dict()`
(wan/modules/model.py of Wan-Video/Wan2.1). diffusers' WanTransformer3DModel holds the same tensors, with
the same shapes, under other names. This table maps one to the other; tools/wan_parity.py and
tools/sample.py use it. Imported by them; needs nothing but the standard library. src/model/wan_names.c holds
the same pairs in C ([model] init, aldit-export): a change goes into both.
"""

# Outside the blocks: Wan prefix -> diffusers prefix (matched at the start of the name).
TOP_LEVEL = [
    ("patch_embedding.", "patch_embedding."),
    ("text_embedding.0.", "condition_embedder.text_embedder.linear_1."),
    ("text_embedding.2.", "condition_embedder.text_embedder.linear_2."),
    ("time_embedding.0.", "condition_embedder.time_embedder.linear_1."),
    ("time_embedding.2.", "condition_embedder.time_embedder.linear_2."),
    ("time_projection.1.", "condition_embedder.time_proj."),
    ("head.head.", "proj_out."),
    ("head.modulation", "scale_shift_table"),
]

# Inside block N (after "blocks.N."): Wan -> diffusers. Wan's norm3 is the affine LayerNorm before the
# cross-attention, diffusers' norm2 (diffusers' norm1 / norm3 have no parameters, like Wan's norm1 / norm2).
IN_BLOCK = [
    ("self_attn.q.", "attn1.to_q."),
    ("self_attn.k.", "attn1.to_k."),
    ("self_attn.v.", "attn1.to_v."),
    ("self_attn.o.", "attn1.to_out.0."),
    ("self_attn.norm_q.", "attn1.norm_q."),
    ("self_attn.norm_k.", "attn1.norm_k."),
    ("cross_attn.q.", "attn2.to_q."),
    ("cross_attn.k.", "attn2.to_k."),
    ("cross_attn.v.", "attn2.to_v."),
    ("cross_attn.o.", "attn2.to_out.0."),
    ("cross_attn.norm_q.", "attn2.norm_q."),
    ("cross_attn.norm_k.", "attn2.norm_k."),
    ("norm3.", "norm2."),
    ("ffn.0.", "ffn.net.0.proj."),
    ("ffn.2.", "ffn.net.2."),
    ("modulation", "scale_shift_table"),
]


def _rename(name, table, source, target):
    for pair in table:
        if name.startswith(pair[source]):
            return pair[target] + name[len(pair[source]):]
    return None


def _convert(name, source, target):
    """Map one name; source/target index into the (wan, diffusers) pairs. KeyError when it has no partner."""
    if name.startswith("blocks."):
        _, layer, rest = name.split(".", 2)
        mapped = _rename(rest, IN_BLOCK, source, target)
        if mapped is not None:
            return f"blocks.{layer}.{mapped}"
    else:
        mapped = _rename(name, TOP_LEVEL, source, target)
        if mapped is not None:
            return mapped
    raise KeyError(f"parameter {name} has no {'diffusers' if target else 'Wan'} name (Wan 2.1 text-to-video only)")


def wan_to_diffusers(name):
    """'blocks.0.self_attn.q.weight' -> 'blocks.0.attn1.to_q.weight'."""
    return _convert(name, 0, 1)


def diffusers_to_wan(name):
    """'blocks.0.attn1.to_q.weight' -> 'blocks.0.self_attn.q.weight'."""
    return _convert(name, 1, 0)


def rename_state(state, to_diffusers):
    """A state dict with every key mapped one way; values are passed through unchanged."""
    convert = wan_to_diffusers if to_diffusers else diffusers_to_wan
    return {convert(name): value for name, value in state.items()}


# aldit's [model] keys (a checkpoint's /model attributes) that the diffusers config needs.
MODEL_KEYS = ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim", "patch_t", "patch_h",
              "patch_w", "text_len", "text_dim", "freq_dim", "qk_norm", "cross_attn_norm")


def diffusers_config(dims, eps=1e-6):
    """WanTransformer3DModel keyword arguments for aldit model dims (a dict with MODEL_KEYS)."""
    if not int(dims.get("qk_norm", 1)):
        raise ValueError("diffusers' WanTransformer3DModel always applies q/k RMSNorm: the model needs qk_norm = 1")
    return dict(
        patch_size=(int(dims["patch_t"]), int(dims["patch_h"]), int(dims["patch_w"])),
        num_attention_heads=int(dims["num_heads"]),
        attention_head_dim=int(dims["dim"]) // int(dims["num_heads"]),
        in_channels=int(dims["in_dim"]),
        out_channels=int(dims["out_dim"]),
        text_dim=int(dims["text_dim"]),
        freq_dim=int(dims["freq_dim"]),
        ffn_dim=int(dims["ffn_dim"]),
        num_layers=int(dims["num_layers"]),
        cross_attn_norm=bool(int(dims["cross_attn_norm"])),
        qk_norm="rms_norm_across_heads",
        eps=eps,
    )


def wan_config(dims, eps=1e-6):
    """Wan's own config.json for the official format (WanModel of Wan-Video/Wan2.1, text-to-video)."""
    return {
        "_class_name": "WanModel", "model_type": "t2v",
        "dim": int(dims["dim"]), "ffn_dim": int(dims["ffn_dim"]), "freq_dim": int(dims["freq_dim"]),
        "num_heads": int(dims["num_heads"]), "num_layers": int(dims["num_layers"]),
        "in_dim": int(dims["in_dim"]), "out_dim": int(dims["out_dim"]), "text_len": int(dims["text_len"]),
        "text_dim": int(dims["text_dim"]),
        "patch_size": [int(dims["patch_t"]), int(dims["patch_h"]), int(dims["patch_w"])],
        "qk_norm": bool(int(dims["qk_norm"])), "cross_attn_norm": bool(int(dims["cross_attn_norm"])),
        "eps": eps, "window_size": [-1, -1],
    }


def wan_sinusoid_timesteps(module):
    """Make a diffusers WanTransformer3DModel embed timesteps as Wan does: the sinusoid in float64
    (Wan's sinusoidal_embedding_1d; aldit computes it in double too). diffusers computes it in float32,
    which moves t = 1000 by up to ~6e-5 radians. Changes nothing else."""
    import torch

    proj = module.condition_embedder.timesteps_proj
    half = proj.num_channels // 2

    def forward(timesteps):
        position = timesteps.to(torch.float64)
        freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=position.device) / half)
        angles = position[:, None] * freqs[None, :]
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)

    proj.forward = forward
    return module
