#!/usr/bin/env python3
"""strata.torch.CPUAdamW against torch.optim.AdamW(foreach=True), in one run.

Both step the same 2^26 fp32 parameters (one tensor, or --tensors N of
equal size) at every core; prints parameters per second for each, their
ratio, the CPU and the instruction set strata's kernels chose.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_adam_bench.py [--params N] [--steps S]
"""
import argparse
import json
import os
import platform
import time

import torch

import strata
import strata.torch


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def time_steps(opt, params, steps):
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    opt.step()  # the first step allocates the states: not timed
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=1 << 26)
    ap.add_argument("--tensors", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (the best is reported)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())  # "all cores" for both: torch may start with fewer
    threads = torch.get_num_threads()
    strata.set_num_threads(0)
    n = args.params // args.tensors
    torch.manual_seed(0)
    init = [torch.randn(n) for _ in range(args.tensors)]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    theirs = [torch.nn.Parameter(t.clone()) for t in init]
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    t_ours = time_steps(strata.torch.CPUAdamW(ours, **kw), ours, args.steps)
    t_theirs = time_steps(torch.optim.AdamW(theirs, foreach=True, **kw), theirs, args.steps)
    total = n * args.tensors
    result = dict(bench="python_adamw", cpu=cpu_name(), isa=strata._strata.isa(), torch=torch.__version__,
                  torch_threads=threads, strata_threads=strata.get_num_threads(), params=total,
                  tensors=args.tensors, strata_params_per_s=total / t_ours, torch_params_per_s=total / t_theirs,
                  ratio=t_theirs / t_ours)
    print(f"cpu: {result['cpu']}; strata's kernels: {result['isa']}; threads: strata {result['strata_threads']}, "
          f"torch {threads}")
    print(f"{total} fp32 parameters in {args.tensors} tensor(s), best of {args.steps} steps")
    print(f"strata.torch.CPUAdamW            {total / t_ours / 1e6:10.1f} M params/s  ({t_ours * 1e3:.1f} ms/step)")
    print(f"torch.optim.AdamW(foreach=True)  {total / t_theirs / 1e6:10.1f} M params/s  ({t_theirs * 1e3:.1f} ms/step)")
    print(f"ratio: {result['ratio']:.2f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
