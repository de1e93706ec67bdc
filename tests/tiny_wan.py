"""tiny_wan.py — tiny random Wan components for the Python tools' tests: a Wan VAE, a umT5 encoder, a tokenizer, media.

    python3 tests/tiny_wan.py models DIR      DIR/vae, DIR/text_encoder (width 24), DIR/tokenizer (word level)
    python3 tests/tiny_wan.py media DIR       captioned images, a video and a frame folder, plus DIR/list.csv

Everything is built here from random numbers and a few words; nothing is downloaded.
"""
import os
import sys

import numpy as np

TEXT_WIDTH = 24
WORDS = "a the red green blue ball cat dog runs sleeps on grass under sky slowly fast small big".split()


def models(folder):
    import torch
    from diffusers import AutoencoderKLWan
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    # the Wan 2.1 VAE's layout (x8 spatial, x4 temporal, 16 latent channels) at a tiny width
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[False, True, True])
    vae.save_pretrained(os.path.join(folder, "vae"))
    tokenizer = Tokenizer(token_models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    # T5 appends its end-of-sequence token to every caption
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                             special_tokens=[("</s>", tokenizer.token_to_id("</s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(os.path.join(folder, "tokenizer"))
    config = UMT5Config(vocab_size=len(fast), d_model=TEXT_WIDTH, d_kv=8, d_ff=32, num_layers=1, num_heads=3,
                        relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id, decoder_start_token_id=0)
    UMT5EncoderModel(config).save_pretrained(os.path.join(folder, "text_encoder"))


def pattern(frames, height, width, seed):
    """Smooth moving colour bands, uint8 [T, H, W, 3]."""
    rng = np.random.default_rng(seed)
    t, y, x = np.meshgrid(np.arange(frames), np.arange(height), np.arange(width), indexing="ij")
    phase = rng.uniform(0, 6.28, 3)
    channels = [np.sin(0.2 * x + 0.15 * y + 0.5 * t + p) for p in phase]
    return ((np.stack(channels, -1) * 0.5 + 0.5) * 255).astype(np.uint8)


def media(folder):
    import av
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    captions = {}
    Image.fromarray(pattern(1, 40, 40, 1)[0]).save(os.path.join(folder, "a_square.png"))
    captions["a_square.png"] = "a red ball on the grass"
    Image.fromarray(pattern(1, 30, 50, 2)[0]).save(os.path.join(folder, "b_wide.png"))
    captions["b_wide.png"] = "  a   small  blue cat sleeps\n"
    with av.open(os.path.join(folder, "c_clip.mp4"), "w") as container:   # 12 frames of 36x52
        stream = container.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 52, 36, "yuv420p"
        for frame in pattern(12, 36, 52, 3):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    captions["c_clip.mp4"] = "the green dog runs fast under the big sky"
    os.makedirs(os.path.join(folder, "d_frames"))
    for i, frame in enumerate(pattern(6, 32, 32, 4)):
        Image.fromarray(frame).save(os.path.join(folder, "d_frames", f"{i:03d}.png"))
    captions["d_frames"] = "a cat runs slowly"
    os.makedirs(os.path.join(folder, "e_short"))   # 3 frames: fewer than any video bucket has
    for i, frame in enumerate(pattern(3, 32, 32, 5)):
        Image.fromarray(frame).save(os.path.join(folder, "e_short", f"{i:03d}.png"))
    captions["e_short"] = "small"
    with open(os.path.join(folder, "list.csv"), "w") as f:
        f.write("path,caption\n")
        for name, caption in captions.items():
            f.write(f'{name},"{caption}"\n')
            stem = name if "." not in name else os.path.splitext(name)[0]
            with open(os.path.join(folder, stem + ".txt"), "w") as text:
                text.write(caption)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] not in ("models", "media"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    {"models": models, "media": media}[sys.argv[1]](sys.argv[2])
