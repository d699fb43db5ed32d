#!/usr/bin/env python3
"""Reads an autocompress checkpoint with h5py (the reference reader) and checks it.

    python3 scripts/check_checkpoint_h5py.py CKPT.h5

Checks the format attributes, that every dataset reads, that bf16 datasets are 16-bit
floats which h5py reads exactly as float32 (`ds[...]` and `ds.astype('float32')[...]`), and, for the
test probe's files, that model/w_bf16 is model/w rounded to bf16 (round to nearest even).
"""
import json
import sys

import h5py
import numpy as np


def bf16_round(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def text(v) -> str:
    """Fixed-length string attributes come back from h5py as bytes."""
    return v.decode() if isinstance(v, bytes) else str(v)


def main(path: str) -> int:
    with h5py.File(path, "r") as f:
        assert text(f.attrs["format"]) == "autocompress-checkpoint", f.attrs["format"]
        assert int(f.attrs["format_version"]) >= 1
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in names:
            ds = f[n]
            data = ds.astype("float32")[...] if text(ds.attrs.get("dtype")) == "bfloat16" else ds[...]
            assert data.shape == ds.shape, n
            if text(ds.attrs.get("dtype")) == "bfloat16":
                # Stored as a 2-byte float; h5py presents the non-IEEE layout as float32.
                assert ds.id.get_type().get_size() == 2 and ds.dtype.kind == "f", (n, ds.dtype)
                assert np.array_equal(ds[...], data), n
        if "model/w_bf16" in f and "model/w" in f:
            w = f["model/w"][...]
            wb = f["model/w_bf16"].astype("float32")[...]
            assert np.array_equal(wb, bf16_round(w)), "bf16 values differ from round-to-nearest-even of w"
        per_rank = json.loads(text(f.attrs["per_rank"]))
        print(f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}): {path}: {len(names)} datasets, "
              f"step {int(f.attrs['step'])}, {len(per_rank)} ranks; bf16 reads exactly as float32: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
