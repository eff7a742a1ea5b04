"""How close FP8 (E4M3) Linear layers can keep a model to its float32 logits, emulated on the CPU.

Issue 34's agreement bar (cosine >= 0.999 per row against bf16) is checked on the GPU by
`libreyolo-bench-models --quantization fp8` (its `fp8_agreement` line). This script separates the
scheme from the kernels: it rounds the weights and the activations of the transformer blocks'
Linear layers through float8_e4m3fn in float32 math (what at::_scaled_mm computes, without the
kernels) and prints each variant's logit cosine against the float32 model, for a
transformers ViT-B/16 with random weights as tools/bench_models/make_random_checkpoint.py writes
it (ViTConfig's defaults, 1000 labels). Variants: every block Linear (the daemon's targets,
models/quantization/fp8.h fp8_target), attention projections only, fc1 only, fc2 only, and every
Linear with 1x128 group scales (finer than the daemon's per-token / per-output-channel ones).

Usage: python tools/bench_models/fp8_emulate.py [--images N] [--seed S]
"""
import argparse
import copy
import re

import torch
import transformers as tr

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def round_e4m3(t, group=None):
    """t rounded through E4M3 with one scale per row of its last dimension (per token for
    activations, per output channel for weights), or per `group` elements of it."""
    t = t.float()
    shape = t.shape
    if group:
        t = t.reshape(*shape[:-1], shape[-1] // group, group)
    scale = t.abs().amax(-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return ((t / scale).to(E4M3).float() * scale).reshape(shape)


def quantised(model, pattern, group=None):
    """A copy of `model` whose block Linear layers matching `pattern` compute on E4M3-rounded
    weights and inputs."""
    model = copy.deepcopy(model)
    for name, layer in model.named_modules():
        if not isinstance(layer, torch.nn.Linear):
            continue
        if not re.search(r"(^|\.)layers?\.", name) or not re.search(pattern, name):
            continue
        layer.weight.data = round_e4m3(layer.weight.data, group)
        layer.register_forward_pre_hook(lambda _m, inp: (round_e4m3(inp[0], group),))
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = tr.ViTForImageClassification(tr.ViTConfig(num_labels=1000)).eval()
    pixels = torch.randn(args.images, 3, 224, 224)  # normalised pixels, as fp8_agreement uses
    cosine = torch.nn.functional.cosine_similarity
    with torch.inference_mode():
        reference = model(pixels).logits
        bf16 = copy.deepcopy(model).to(torch.bfloat16)(pixels.bfloat16()).logits.float()
        rows = [("bfloat16 model", bf16)]
        for label, pattern, group in (("fp8 every block Linear (the daemon's targets)", ".", None),
                                      ("fp8 attention projections only", "_proj", None),
                                      ("fp8 fc1 only", "fc1", None),
                                      ("fp8 fc2 only", "fc2", None),
                                      ("fp8 every block Linear, 1x128 group scales", ".", 128)):
            rows.append((label, quantised(model, pattern, group)(pixels).logits))
        for label, logits in rows:
            c = cosine(logits.float(), reference, dim=-1)
            print(f"fp8_emulate model=vit_base variant=\"{label}\" min_row_cosine={c.min().item():.5f} "
                  f"mean_row_cosine={c.mean().item():.5f} "
                  f"top1_agreement={(logits.argmax(-1) == reference.argmax(-1)).float().mean().item():.3f}")


if __name__ == "__main__":
    main()
