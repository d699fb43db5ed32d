#!/usr/bin/env python3
"""The blk-N validations here: measured and predicted decode step per block count, and the
least-squares a + b x blocks of each (python3 summary.py, from this folder)."""
import glob
import gzip
import json
import os

import numpy as np

for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*-[0-9].json.gz"))):
    rows = json.load(gzip.open(f, "rt"))["rows"]
    n = np.array([int(x["name"].split("-")[1]) for x in rows])
    o = np.argsort(n)
    n = n[o]
    A = np.vstack([np.ones(len(n)), n]).T
    for key in ("measured", "predicted"):
        t = np.array([1e3 * x["decode_s"][key] for x in rows])[o]
        a, b = np.linalg.lstsq(A, t, rcond=None)[0]
        print(f"{os.path.basename(f)} {key:9s} " + " ".join(f"{k}:{v:.3f}" for k, v in zip(n, t)) +
              f"  a={a:.3f} b={b:.3f} ms")
