#!/usr/bin/env python3
"""Fits step cost models to a `metro serve --step-trace FILE` trace and says how well each
predicts the steps (docs/scheduling.md, "Step cost model").

    python3 bench/step_cost_fit.py TRACE [--over 0.2]

Models (least squares over the whole trace, and fitted on each half to predict the other):
  3-term  fixed + per prompt token + per decode          (the engine's model before 2026-12-01)
  4-term  fixed + per token (prompt or decode) + per prompt attention pair + per decode key
          (sched::StepCostFit, what the engine fits now)
Also prints where engine time went by the 4-term model (matmuls, prompt attention, decode
attention) and how many steps took longer than --over seconds. Plain Python, no numpy.
"""

import argparse
import math


def solve(a, b):
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            raise ValueError("singular")
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def lstsq(xs, ys):
    k = len(xs[0])
    a = [[sum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    b = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(k)]
    return solve(a, b)


def features(rows, kind):
    if kind == "3-term":
        return [[1.0, p, d] for _, p, d, _, _ in rows]
    return [[1.0, p + d, pp, dk] for _, p, d, pp, dk in rows]


def report(rows, kind):
    ys = [r[0] for r in rows]
    xs = features(rows, kind)
    c = lstsq(xs, ys)
    res = [y - sum(ci * xi for ci, xi in zip(c, x)) for x, y in zip(xs, ys)]
    rms = math.sqrt(sum(r * r for r in res) / len(res))
    rel = math.sqrt(sum((r / y) ** 2 for r, y in zip(res, ys) if y > 0) / len(res))
    h = len(rows) // 2
    cross = []
    for fit, test in ((slice(0, h), slice(h, None)), (slice(h, None), slice(0, h))):
        cf = lstsq(xs[fit], ys[fit])
        r = [y - sum(ci * xi for ci, xi in zip(cf, x)) for x, y in zip(xs[test], ys[test])]
        cross.append((cf, math.sqrt(sum(v * v for v in r) / len(r)), sum(1 for v in r if v > 0.02)))
    names = (["fixed", "per prompt token", "per decode"] if kind == "3-term"
             else ["fixed", "per token", "per prompt pair", "per decode key"])
    print(f"{kind}: " + ", ".join(f"{n} {v:.3g} s" for n, v in zip(names, c)))
    print(f"  residual rms {rms * 1e3:.1f} ms, relative rms {rel:.3f}")
    for i, (cf, r, under) in enumerate(cross):
        print(f"  fitted on half {i + 1}: " + ", ".join(f"{v:.3g}" for v in cf) +
              f"; on the other half rms {r * 1e3:.1f} ms, {under} steps > 20 ms longer than predicted")
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--over", type=float, default=0.2, help="count steps longer than this (s)")
    args = ap.parse_args()
    rows = []
    with open(args.trace) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            s, p, d, pp, dk = line.split()
            rows.append((float(s), int(p), int(d), float(pp), float(dk)))
    if len(rows) < 10:
        raise SystemExit(f"{args.trace}: {len(rows)} steps, too few to fit")
    total = sum(r[0] for r in rows)
    print(f"{len(rows)} steps, {total:.1f} s; {sum(1 for r in rows if r[0] > args.over)} longer than "
          f"{args.over} s; prompt tokens {sum(r[1] for r in rows)}, decodes {sum(r[2] for r in rows)}")
    report(rows, "3-term")
    c = report(rows, "4-term")
    mat = sum(c[1] * (r[1] + r[2]) for r in rows)
    pa = sum(c[2] * r[3] for r in rows)
    da = sum(c[3] * r[4] for r in rows)
    fx = c[0] * len(rows)
    print(f"engine time by the 4-term model: fixed {fx:.1f} s, per-token {mat:.1f} s, prompt attention "
          f"{pa:.1f} s, decode attention {da:.1f} s ({(pa + da) / total:.0%} attention)")


if __name__ == "__main__":
    main()
