"""Sweep 200 plans of the Llama-3-70B example (64 H100s) and plot step time against the
tensor- and pipeline-parallel widths.

    python python/examples/sweep.py [OUTPUT.png]

Each plan is the example spec with other `[plan]` values (`Spec.with_values`), estimated
in this process. Plans that do not fit, or that the validator refuses (with its reason), are kept as
rows with `feasible = False`. The plot
(matplotlib, when installed) shows, for each tensor width, the best step time at each
pipeline width.
"""

import itertools
import sys
import time
from pathlib import Path

import archplace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "specs" / "estimate-llama3-70b-h100.toml"
DEVICES = 64


def plans():
    """200 plans over t, p, micro-batch, recomputation and sequence parallelism (d is what
    the 64 devices leave)."""
    grid = itertools.product(
        [1, 2, 4, 8],  # tensor_parallel
        [1, 2, 4, 8],  # pipeline_parallel
        [1, 2, 4],  # micro_batch
        ["none", "selective", "full"],  # recomputation
        [True, False],  # sequence_parallel
    )
    chosen = [
        {
            "plan.tensor_parallel": t,
            "plan.pipeline_parallel": p,
            "plan.data_parallel": DEVICES // (t * p),
            "plan.interleaving": 1,
            "plan.micro_batch": mb,
            "plan.recomputation": rc,
            "plan.sequence_parallel": sp,
        }
        for t, p, mb, rc, sp in grid
        if not (sp and t == 1)
    ]
    return chosen[:200]


def sweep():
    base = archplace.Spec(EXAMPLE)
    rows = []
    for values in plans():
        row = {key.split(".", 1)[1]: value for key, value in values.items()}
        try:
            e = archplace.estimate(base.with_values(values))
        except archplace.SpecError as err:
            # A plan the validator refuses (e.g. a batch that does not split): its reason.
            row.update(feasible=False, step_seconds=None, why=err.errors[0].message)
        else:
            row.update(feasible=e.feasible, step_seconds=e.step_seconds if e.feasible else None)
        rows.append(row)
    return rows


def main():
    started = time.perf_counter()
    rows = sweep()
    seconds = time.perf_counter() - started
    fits = [r for r in rows if r["feasible"]]
    print(f"{len(rows)} plans in {seconds:.2f} s, {len(fits)} fit")
    best = min(fits, key=lambda r: r["step_seconds"])
    print(f"fastest: {best}")
    try:
        import pandas
    except ImportError:
        return
    frame = pandas.DataFrame(rows)
    table = frame[frame.feasible].pivot_table(
        index="pipeline_parallel", columns="tensor_parallel", values="step_seconds", aggfunc="min"
    )
    print(table)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("sweep.png")
    ax = table.plot(marker="o", logy=True)
    ax.set_xlabel("pipeline-parallel width")
    ax.set_ylabel("best step time (s)")
    ax.set_title("Llama-3-70B on 64 H100s: step time by tensor width")
    plt.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
