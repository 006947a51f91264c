"""``python -m bench chunked-logps``: peak memory of chunked vs unchunked log-probabilities."""
from __future__ import annotations

import argparse
import json
import os

from bench import worker
from labkit.memory import GIB
from labkit.monitor import peak_rss_bytes, reset_peak_rss

__all__ = ["main", "measure_chunked"]


# Measured on CPU (results/chunked_logps.json): the unchunked path peaks near 4.3 x the fp32 logits
# (logits, log-sum-exp backward temporaries, the gather's gradient, their sum). Used to refuse a
# run that would not fit in this machine's memory, before it starts.
_UNCHUNKED_PEAK_FACTOR = 4.5


def measure_chunked(spec: dict) -> dict:
    """Score ``sequences x completion_len`` tokens with :func:`labkit.objective.per_token_logps`, forward
    and backward, and return the peak memory and times (runs in a fresh process)."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from labkit.monitor import process_rss
    from labkit.models import architecture_config
    from labkit.objective import per_token_logps

    torch.set_num_threads(spec["threads"])
    config = architecture_config(spec["model"], num_hidden_layers=spec["layers"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # As with LoRA, the LM head (tied to the embedding) does not train: what remains is the cost of
    # the log-probabilities themselves, not of a (V, H) weight gradient.
    model.get_input_embeddings().weight.requires_grad_(False)
    generator = torch.Generator().manual_seed(1)
    seq = spec["prompt_len"] + spec["completion_len"]
    input_ids = torch.randint(0, config.vocab_size, (spec["sequences"], seq), generator=generator)  # (B, P + C)
    attention_mask = torch.ones_like(input_ids)
    advantages = torch.randn(spec["sequences"], 1, generator=generator)  # (B, 1) a GRPO-like weighting
    import gc

    gc.collect()
    baseline = process_rss()
    reset_peak_rss()
    started = time.perf_counter()
    logps = per_token_logps(model, input_ids, attention_mask, spec["completion_len"],
                            chunk_size=spec["chunk_size"])  # (B, C)
    forward_s = time.perf_counter() - started
    (-(logps * advantages).mean()).backward()
    backward_s = time.perf_counter() - started - forward_s
    peak = peak_rss_bytes() - baseline
    grad = model.model.layers[-1].mlp.down_proj.weight.grad  # (H, I) one weight's gradient, to compare variants
    torch.save({"logps": logps.detach(), "grad": grad}, spec["tensors"])
    return dict(status="ok", peak_bytes=peak, forward_s=forward_s, backward_s=backward_s,
                baseline_rss_bytes=baseline)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench chunked-logps``: peak CPU memory of chunked vs unchunked log-probs.

    Runs :func:`labkit.objective.per_token_logps` (forward and backward) on a one-layer model with
    the width and vocabulary of ``--model`` (Qwen2.5-0.5B: 896 and 151,936), random weights, the LM
    head frozen, for ``--sequences`` sequences of ``--completion-len`` scored tokens, once unchunked
    and once per ``--chunk-sizes``. Each variant runs in a fresh process; its peak is the peak
    resident memory during the forward and backward minus the resident memory just before (model
    and inputs already built), read from the kernel (``VmHWM`` after resetting it), with glibc's
    mmap threshold fixed so that freed tensors leave the resident set. Values and gradients of the
    variants are compared. A variant that would not fit in the memory available now is skipped,
    not run. Appends a record to ``results/chunked_logps.json``.
    """
    import tempfile

    import psutil

    from bench import results_dir, write_json
    from labkit.lab import provenance
    from labkit.models import architecture_config

    parser = argparse.ArgumentParser(prog="python -m bench chunked-logps", description=main.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="catalogue architecture (width, vocabulary)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=512)
    parser.add_argument("--chunk-sizes", nargs="+", default=["none", "1024", "256"],
                        help="positions per chunk; 'none' is the unchunked baseline")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--headroom-gib", type=float, default=3.0,
                        help="memory to leave free for everything else on this machine")
    parser.add_argument("--out", default=None, help="JSON file (default results/chunked_logps.json)")
    args = parser.parse_args(argv)

    config = architecture_config(args.model)
    vocab = config.vocab_size
    scored = args.sequences * args.completion_len
    logits_gib = scored * vocab * 4 / GIB
    chunk_sizes = [None if c.lower() == "none" else int(c) for c in args.chunk_sizes]
    settings = dict(model=args.model, layers=args.layers, hidden_size=config.hidden_size, vocab_size=vocab,
                    sequences=args.sequences, prompt_len=args.prompt_len, completion_len=args.completion_len,
                    dtype="fp32", lm_head="frozen", threads=args.threads, scored_tokens=scored,
                    full_logits_gib=round(logits_gib, 3))
    print(f"{args.sequences} sequences x {args.completion_len} scored tokens x vocabulary {vocab:,}: "
          f"the fp32 logits alone are {logits_gib:.2f} GiB")
    runs, tensors = [], {}
    folder = tempfile.mkdtemp(prefix="labkit-chunked-")
    for chunk in chunk_sizes:
        name = "unchunked" if chunk is None else f"chunk {chunk}"
        rows = scored if chunk is None else min(chunk, scored)
        need_gib = _UNCHUNKED_PEAK_FACTOR * rows * vocab * 4 / GIB + 1.0
        available_gib = psutil.virtual_memory().available / GIB
        if need_gib > available_gib - args.headroom_gib:
            reason = (f"not run: needs about {need_gib:.1f} GiB ({_UNCHUNKED_PEAK_FACTOR} x its {rows} x {vocab} "
                      f"fp32 logits), {available_gib:.1f} GiB available, {args.headroom_gib} GiB kept free")
            print(f"{name:<10} {reason}")
            runs.append(dict(variant=name, chunk_size=chunk, status="skipped", reason=reason))
            continue
        spec = dict(model=args.model, layers=args.layers, sequences=args.sequences, prompt_len=args.prompt_len,
                    completion_len=args.completion_len, chunk_size=chunk, threads=args.threads,
                    tensors=os.path.join(folder, f"{name.replace(' ', '_')}.pt"))
        result = worker.run("chunked", spec, timeout=3600)
        if result.get("status") != "ok":
            print(f"{name:<10} failed: {result.get('error')}")
            runs.append(dict(variant=name, chunk_size=chunk, status="error", reason=result.get("error")))
            continue
        tensors[name] = spec["tensors"]
        run = dict(variant=name, chunk_size=chunk, status="ok", peak_gib=round(result["peak_bytes"] / GIB, 3),
                   forward_s=round(result["forward_s"], 2), backward_s=round(result["backward_s"], 2))
        runs.append(run)
        print(f"{name:<10} peak {run['peak_gib']:.3f} GiB over baseline | forward {run['forward_s']:.1f} s, "
              f"backward {run['backward_s']:.1f} s", flush=True)

    import torch

    summary = {}
    if "unchunked" in tensors:
        reference = torch.load(tensors["unchunked"])
        base = next(r for r in runs if r["variant"] == "unchunked")
        for run in runs:
            if run["status"] != "ok" or run["variant"] == "unchunked":
                continue
            other = torch.load(tensors[run["variant"]])
            run["max_abs_diff_logps"] = float((other["logps"] - reference["logps"]).abs().max())
            run["max_abs_diff_grad"] = float((other["grad"] - reference["grad"]).abs().max())
            run["peak_reduction_pct"] = round(100 * (1 - run["peak_gib"] / base["peak_gib"]), 1)
            summary[run["variant"]] = run["peak_reduction_pct"]
            print(f"{run['variant']:<10} {run['peak_reduction_pct']:.1f} % lower peak; max |diff| logps "
                  f"{run['max_abs_diff_logps']:.2e}, gradient {run['max_abs_diff_grad']:.2e}")
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    record = dict(settings=settings, runs=runs, peak_reduction_pct=summary,
                  measure="peak RSS (VmHWM, reset before the call) minus RSS before, fresh process per variant",
                  provenance=provenance())
    out = args.out or results_dir() / "chunked_logps.json"
    existing = json.loads(open(out).read()) if os.path.exists(out) else {"records": []}
    existing.setdefault("records", []).append(record)
    write_json(out, existing)
    print(f"appended to {out}")
    return 0 if all(r["status"] != "error" for r in runs) else 1
