#!/usr/bin/env python3
"""Fits step cost models to a `metro serve --step-trace FILE` trace and says how well each
predicts the steps (docs/scheduling.md, "Step cost model").

    python3 bench/step_cost_fit.py TRACE [--over 0.2]

Models (least squares over the whole trace, and fitted on each half to predict the other):
  3-term  fixed + per prompt token + per decode          (no attention terms)
  4-term  fixed + per token (prompt or decode) + per prompt attention pair + per decode key
          (sched::StepCostFit, what the engine fits now)
  split   traces with the attention time of each step (their 6th and 7th columns, logit rows
          and attention seconds): attention fitted alone
          on prompt pairs and decode keys, the rest on fixed + per token + per logit row
          (a decode's lm_head row and its draw), summed; a check on the 4-term model's one
          shared per-token term (docs/scheduling.md, "Step cost model")
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
        return [[1.0, r[1], r[2]] for r in rows]
    return [[1.0, r[1] + r[2], r[3], r[4]] for r in rows]


def split_fit(rows):
    """(fixed, per token, per logit row, per prompt pair, per decode key): the attention
    seconds on pairs and keys, the rest of the step on 1, tokens and logit rows."""
    a = lstsq([[r[3], r[4]] for r in rows], [r[6] for r in rows])
    b = lstsq([[1.0, r[1] + r[2], r[5]] for r in rows], [r[0] - r[6] for r in rows])
    return [b[0], b[1], b[2], a[0], a[1]]


def split_predict(c, r):
    return c[0] + c[1] * (r[1] + r[2]) + c[2] * r[5] + c[3] * r[3] + c[4] * r[4]


def report_split(rows):
    c = split_fit(rows)
    res = [r[0] - split_predict(c, r) for r in rows]
    rms = math.sqrt(sum(v * v for v in res) / len(res))
    rel = math.sqrt(sum((v / r[0]) ** 2 for v, r in zip(res, rows) if r[0] > 0) / len(res))
    print("split: " + ", ".join(f"{n} {v:.3g} s" for n, v in zip(
        ["fixed", "per token", "per logit row", "per prompt pair", "per decode key"], c)))
    print(f"  residual rms {rms * 1e3:.1f} ms, relative rms {rel:.3f}")
    h = len(rows) // 2
    for i, (fit, test) in enumerate(((rows[:h], rows[h:]), (rows[h:], rows[:h]))):
        cf = split_fit(fit)
        r = [t[0] - split_predict(cf, t) for t in test]
        print(f"  fitted on half {i + 1}: " + ", ".join(f"{v:.3g}" for v in cf) +
              f"; on the other half rms {math.sqrt(sum(v * v for v in r) / len(r)) * 1e3:.1f} ms, "
              f"{sum(1 for v in r if v > 0.02)} steps > 20 ms longer than predicted")
    att = sum(r[6] for r in rows)
    pa = sum(c[3] * r[3] for r in rows)
    da = sum(c[4] * r[4] for r in rows)
    print(f"  measured attention {att:.1f} s of {sum(r[0] for r in rows):.1f} s; by the fit prompt "
          f"{pa:.1f} s, decode {da:.1f} s; logit rows {c[2] * sum(r[5] for r in rows):.1f} s")


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
            f = line.split()
            row = (float(f[0]), int(f[1]), int(f[2]), float(f[3]), float(f[4]))
            if len(f) >= 7:
                row += (int(f[5]), float(f[6]))
            rows.append(row)
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
    if all(len(r) >= 7 for r in rows):
        report_split(rows)


if __name__ == "__main__":
    main()
