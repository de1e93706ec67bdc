"""tiny_hunyuan.py — tiny random HunyuanVideo-1.5 components for the Python tools' tests, in a diffusers folder layout.

    python3 tests/tiny_hunyuan.py models DIR   DIR/vae (AutoencoderKLHunyuanVideo15, 4 latent channels),
                                               DIR/text_encoder (Qwen2_5_VLTextModel, width 12) and DIR/tokenizer
                                               (byte-level BPE with a chat template), DIR/text_encoder_2 (T5 encoder,
                                               width 6) and DIR/tokenizer_2 (ByT5), DIR/image_encoder (SigLIP, width
                                               10, 4 tokens of a 28x28 image) and DIR/feature_extractor; prints the
                                               template's token count before the caption (--qwen-crop-start)

Everything is built here from random numbers; nothing is downloaded. The widths match tests/decks/hunyuan_tiny.ini
(text_dim 12, text_2_dim 6, image_dim 10, out_dim 4).
"""
import os
import sys

TEXT_WIDTH, TEXT_2_WIDTH, IMAGE_WIDTH, LATENT_CHANNELS = 12, 6, 10, 4
# the user turn of a chat as Qwen's template writes it; the system message is left out to keep captions short
CHAT_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'user' %}<|im_start|>user\n"
                 "{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def models(folder):
    import torch
    from diffusers import AutoencoderKLHunyuanVideo15
    from tokenizers import Tokenizer, decoders, models as token_models, pre_tokenizers, trainers
    from transformers import (ByT5Tokenizer, PreTrainedTokenizerFast, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel,
                              SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel, T5Config, T5EncoderModel)

    torch.manual_seed(0)
    # the HunyuanVideo-1.5 VAE's layout (x16 spatial, x4 temporal) at a tiny width
    AutoencoderKLHunyuanVideo15(latent_channels=LATENT_CHANNELS, block_out_channels=(8, 8, 8, 8, 8),
                                layers_per_block=1).save_pretrained(os.path.join(folder, "vae"))
    bpe = Tokenizer(token_models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["a red ball on the grass, a cat runs"],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|endoftext|>", eos_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(os.path.join(folder, "tokenizer"))
    config = Qwen2_5_VLTextConfig(vocab_size=len(tokenizer), hidden_size=TEXT_WIDTH, intermediate_size=24,
                                  num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 1]},
                                  pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                                  eos_token_id=tokenizer.eos_token_id)
    Qwen2_5_VLTextModel(config).save_pretrained(os.path.join(folder, "text_encoder"))
    byt5 = ByT5Tokenizer()
    byt5.save_pretrained(os.path.join(folder, "tokenizer_2"))
    T5EncoderModel(T5Config(vocab_size=len(byt5), d_model=TEXT_2_WIDTH, d_kv=4, d_ff=8, num_layers=1, num_heads=2,
                            relative_attention_num_buckets=8)).save_pretrained(os.path.join(folder, "text_encoder_2"))
    SiglipVisionModel(SiglipVisionConfig(hidden_size=IMAGE_WIDTH, intermediate_size=12, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=28, patch_size=14)).save_pretrained(
        os.path.join(folder, "image_encoder"))
    SiglipImageProcessor(size={"height": 28, "width": 28}).save_pretrained(os.path.join(folder, "feature_extractor"))
    # the template's tokens before the caption: what the pipeline's crop_start (108 for Qwen2.5-VL's) drops
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False).split("\x00")[0]
    print(len(tokenizer(prefix, add_special_tokens=False).input_ids))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) != 3 or sys.argv[1] != "models":
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    models(sys.argv[2])
