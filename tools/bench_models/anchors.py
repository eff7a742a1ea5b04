"""The anchors of the end-to-end benchmark (docs/BENCHMARKS.md): transformers 5.17 eager and
torch.compile on the same checkpoint folders, input sizes and batches as libreyolo-bench-models.

Usage: anchors.py CKPT_DIR [--batch 1,32] [--size 640|HxW] [--iters 20] [--warmup 5]
                  [--modes eager_fp32,eager_bf16_cl,compile_bf16_cl] [--device cuda|cpu]
                  [--compile-backend inductor|eager] [--prompt "a cat. a dog."] [--threads N]
Modes: KIND_DTYPE[_cl]: KIND is eager (transformers as loaded), compile (torch.compile, default
mode), freeze (torch.compile with torch._inductor.config.freezing = True: weights folded as
constants, BatchNorm folded into convolutions; what a PyTorch deployer runs) or freezero (freeze
plus mode="reduce-overhead", i.e. CUDA graphs: the batch-1 anchor); DTYPE fp32|bf16|fp16; _cl
converts model and input to channels_last.
The model class follows config.json: AutoModelForImageClassification for vit / swin,
AutoModelForZeroShotObjectDetection for the open-vocabulary families (owlvit, owlv2,
grounding-dino, mm-grounding-dino, omdet-turbo), else AutoModelForObjectDetection (RT-DETR, D-FINE, ...).
Open-vocabulary models take the text with every call, as transformers users run them: the
folder's processor (AutoProcessor) makes input_ids / attention_mask (/ token_type_ids) of
--prompt for each of the batch's images (OWL: the labels split at '.', one query each, padded
to 16 tokens; Grounding DINO: the caption as given), once before timing; every timed forward
(eager or compiled, whole model) runs the text encoder on them. transformers has no prompt
cache: these are the anchors of libreyolo-bench-models' --prompt-cache on and off alike.
Prints one line per (mode, batch): `anchor model=M mode=M batch=B size=S ms=X img_s=Y tf32=off`
(+ `threads=N` on the CPU, `text=SHAPE` of input_ids for the open-vocabulary models).
Times are CUDA-event medians of --iters forwards after --warmup (the compile time is in the
warm-up and printed separately as `compile_s`). TF32 is off for the fp32 mode (what parity runs)
and irrelevant for bf16. --device cpu times wall-clock medians (the CPU rows of
docs/BENCHMARKS.md: fp32, --threads as libreyolo's OMP_NUM_THREADS; else torch's default).
"""
import argparse
import copy
import statistics
import sys
import time

import torch
import transformers as tr

CLASSIFIERS = {"vit", "swin"}
PROMPTED = {"owlvit", "owlv2", "grounding-dino", "mm-grounding-dino", "omdet-turbo"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KINDS = ("eager", "compile", "freeze", "freezero")


def parse_size(text):
    h, _, w = text.partition("x")
    return int(h), int(w or h)


def parse_mode(mode):
    """'compile_bf16_cl' -> ('compile', torch.bfloat16, True); raises ValueError otherwise."""
    parts = mode.split("_")
    if len(parts) not in (2, 3) or parts[0] not in KINDS or parts[1] not in DTYPES \
            or (len(parts) == 3 and parts[2] != "cl"):
        raise ValueError(f"--modes: unknown mode '{mode}' (expected {'|'.join(KINDS)} _ "
                         "fp32|bf16|fp16 [_cl])")
    return parts[0], DTYPES[parts[1]], len(parts) == 3


def timed(fn, x, iters, warmup, cuda):
    for _ in range(warmup):
        fn(x)
    if not cuda:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(x)
            times.append((time.perf_counter() - t0) * 1000.0)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def prompt_inputs(processor, model_type, prompt, batch, device):
    """The processor's text tensors of `prompt` for `batch` images: OWL one query per label
    ((batch * labels, 16) ids), Grounding DINO one caption per image ((batch, T) ids), OmDet-Turbo
    the labels as classes and the default task per image."""
    labels = [x.strip() for x in prompt.split(".") if x.strip()]
    if model_type in ("owlvit", "owlv2"):
        enc = processor(text=[labels] * batch, return_tensors="pt")
    elif model_type == "omdet-turbo":
        # OmDetTurboProcessor needs images with the text; only its text tensors are kept (the
        # labels as classes, the default task "Detect a cat, a dog." per image).
        images = [torch.zeros(3, 32, 32, dtype=torch.uint8)] * batch
        enc = processor(images=images, text=[labels] * batch, return_tensors="pt")
        return {k: v.to(device) for k, v in enc.items() if k.startswith(("classes_", "tasks_"))}
    else:
        enc = processor(text=[prompt] * batch, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--size", default="640")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--modes", default="eager_fp32,eager_bf16_cl,compile_bf16_cl")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--prompt", default="a cat. a dog.",
                   help="open-vocabulary models: the text of every image (labels separated by '.')")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend (inductor = the default mode; eager: dynamo's trace "
                        "only, to test this script quickly on a CPU)")
    a = p.parse_args()
    height, width = parse_size(a.size)
    modes = [(m, *parse_mode(m)) for m in a.modes.split(",")]
    cuda = a.device == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    config = tr.AutoConfig.from_pretrained(a.ckpt)
    prompted = config.model_type in PROMPTED
    auto = tr.AutoModelForImageClassification if config.model_type in CLASSIFIERS \
        else tr.AutoModelForZeroShotObjectDetection if prompted else tr.AutoModelForObjectDetection
    processor = tr.AutoProcessor.from_pretrained(a.ckpt) if prompted else None
    # Kept in float32 on the CPU: each mode converts a copy, since nn.Module.to(dtype) works in
    # place and a float32 mode after a bfloat16 one would otherwise run on rounded weights.
    model = auto.from_pretrained(a.ckpt).eval()
    name = a.ckpt.rstrip("/").split("/")[-1]
    size = a.size if height != width else str(height)
    for mode, kind, dtype, cl in modes:
        m = copy.deepcopy(model).to(device=a.device, dtype=dtype)
        # OmDet-Turbo keeps its text encodings in LRU caches of the model (transformers'
        # OmDetTurboLRUCache, language_cache_class / language_cache_prompt): entries of the
        # previous mode's dtype would reach this mode's GEMMs. Within a mode the cache stays, as a
        # transformers user has it (a repeated prompt costs the vision side only).
        for attr in ("language_cache_class", "language_cache_prompt"):
            cache = getattr(m, attr, None)
            if cache is not None and hasattr(cache, "cache"):
                cache.cache.clear()
                cache.current_load = 0
        fmt = torch.channels_last if cl else torch.contiguous_format
        m = m.to(memory_format=fmt)
        for b in [int(x) for x in a.batch.split(",")]:
            # A fresh compile per batch: a second shape would otherwise recompile with dynamic
            # shapes, which is not what a deployer running one batch size gets.
            torch._dynamo.reset()
            torch._inductor.config.freezing = kind in ("freeze", "freezero")
            if kind == "eager":
                fn = m
            else:
                opts = dict(backend=a.compile_backend)
                if kind == "freezero":
                    opts["mode"] = "reduce-overhead"
                fn = torch.compile(m, **opts)
            x = torch.randn(b, 3, height, width, device=a.device, dtype=dtype)
            x = x.contiguous(memory_format=fmt)
            text = prompt_inputs(processor, config.model_type, a.prompt, b, a.device) if prompted else {}
            with torch.inference_mode():
                t0 = time.time()
                run = lambda t: fn(pixel_values=t, **text)
                if kind != "eager":
                    run(x)
                    if cuda:
                        torch.cuda.synchronize()
                    print(f"anchor model={name} mode={mode} batch={b} size={size} "
                          f"compile_s={time.time() - t0:.1f}", flush=True)
                ms = timed(run, x, a.iters, a.warmup, cuda)
            print(f"anchor model={name} mode={mode} batch={b} size={size} "
                  f"ms={ms:.3f} img_s={b * 1000.0 / ms:.1f} tf32=off"
                  f"{' threads=%d' % torch.get_num_threads() if not cuda else ''}"
                  f"{' text=' + 'x'.join(map(str, next(iter(text.values())).shape)) if prompted else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
