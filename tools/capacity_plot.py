#!/usr/bin/env python3
"""Draws `strata capacity --json` as a PNG: the largest trainable model per
offload mode (parameters, log axis) and its training speed (tokens/s).

Usage: capacity_plot.py CAPACITY.json OUT.png
`strata capacity --plot OUT.png` runs this with Debian's python3-matplotlib.
"""
import json
import sys


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: capacity_plot.py CAPACITY.json OUT.png\n")
        return 2
    try:
        import matplotlib
    except ImportError:
        sys.stderr.write("capacity_plot.py: matplotlib is missing (Debian package python3-matplotlib)\n")
        return 1
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(argv[1]) as f:
        data = json.load(f)
    rows = [r for r in data["rows"] if r.get("params", 0) > 0]
    if not rows:
        sys.stderr.write("capacity_plot.py: no mode found a model that fits: nothing to plot\n")
        return 1
    labels = ["%d. %s" % (r["mode_id"], r["mode"].replace("_", " ")) for r in rows]
    params = [r["params"] for r in rows]
    trained = [r.get("trained", False) for r in rows]
    speed = [r.get("tokens_per_s", 0.0) for r in rows]
    plan_only = data.get("plan_only", False)
    colours = ["#2b7bba" if t else "#b0b0b0" for t in trained]
    if plan_only:
        colours = ["#7fb2d9"] * len(rows)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    y = range(len(rows))
    left.barh(y, params, color=colours)
    left.set_xscale("log")
    left.set_yticks(list(y))
    left.set_yticklabels(labels)
    left.invert_yaxis()
    left.set_xlabel("parameters of the largest model that trains (log scale)")
    base = params[0] if rows[0]["mode_id"] == 1 else None
    def count(p):
        return "%.3gB" % (p / 1e9) if p >= 1e9 else "%.3gM" % (p / 1e6)

    for i, (p, r) in enumerate(zip(params, rows)):
        text = "%s %dx%d" % (count(p), r["layers"], r["hidden"])
        if base:
            text += "  (%.1fx)" % (p / base)
        left.text(p, i, " " + text, va="center", fontsize=8)
    left.set_xlim(min(params) / 2, max(params) * 30)
    left.set_title("capacity per offload mode" + (" (planned only)" if plan_only else ""))

    right.barh(y, speed, color=colours)
    right.set_yticks(list(y))
    right.set_yticklabels([])
    right.invert_yaxis()
    right.set_xlabel("training tokens per second, measured (log scale)")
    right.set_title("speed of that model")
    for i, s in enumerate(speed):
        if s > 0:
            right.text(s, i, " %.3g" % s, va="center", fontsize=8)
    positive = [s for s in speed if s > 0]
    if positive:
        right.set_xscale("log")
        right.set_xlim(min(positive) / 2, max(positive) * 10)

    b = data.get("budgets", {})
    gib = 1024.0 ** 3
    subtitle = "device %s (%.2f GiB), host %.1f GiB, NVMe %.0f GiB; seq %s, micro-batch %s" % (
        data.get("device", "?"), b.get("device", 0) / gib, b.get("host", 0) / gib, b.get("nvme", 0) / gib,
        data.get("seq", "?"), data.get("micro_batch", "?"))
    cpu = data.get("machine", {}).get("cpu")
    if cpu:
        subtitle += "\n" + str(cpu)
    fig.suptitle("strata capacity: grey = did not train, blue = trained (loss fell)\n" + subtitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print("plot: %s" % argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
