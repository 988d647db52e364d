"""Derive the policy's compact copy of Gavel's throughput matrix from Gavel's own file.

``python -m bench.sched.derive_gavel ../shared/data/gavel/simulation_throughputs.json``
rewrites ``agent/policy/gavel_throughputs.json``: for each worker type, the isolated steps/s of
every model at each scale factor (consolidated on one server, and spread over servers), and for
one-GPU jobs the steps/s of each model when it shares the GPU with each other model
(``[self, other]``). Figures keep four significant digits; missing or zero figures are ``null``.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "agent" / "policy" / "gavel_throughputs.json"
TYPES = ("v100", "p100", "k80")
SCALES = (1, 2, 4, 8)


def _round(value: float) -> float | None:
    return float(f"{value:.4g}") if value > 0 else None


def derive(raw: dict[str, Any]) -> dict[str, Any]:
    models = sorted({ast.literal_eval(k)[0] for k in raw["v100"]})
    index = {m: i for i, m in enumerate(models)}
    types: dict[str, Any] = {}
    for wt in TYPES:
        out: dict[str, Any] = {"isolated": {}, "unconsolidated": {}, "shared": []}
        for variant, name in ((wt, "isolated"), (f"{wt}_unconsolidated", "unconsolidated")):
            for scale in SCALES:
                row: list[float | None] = [None] * len(models)
                for key, entry in raw[variant].items():
                    model, sf = ast.literal_eval(key)
                    if sf == scale:
                        row[index[model]] = _round(entry["null"])
                out[name][str(scale)] = row
        shared: list[list[list[float | None] | None]] = [[None] * len(models) for _ in models]
        for key, entry in raw[wt].items():
            model, sf = ast.literal_eval(key)
            if sf != 1:
                continue
            for other_key, pair in entry.items():
                if other_key == "null":
                    continue
                other, other_sf = ast.literal_eval(other_key)
                if other_sf != 1:
                    continue
                self_rate, other_rate = (_round(float(x)) for x in pair)
                if self_rate is not None and other_rate is not None:
                    shared[index[model]][index[other]] = [self_rate, other_rate]
        out["shared"] = shared
        types[wt] = out
    return {
        "source": "stanford-futuredata/gavel c4fa4009 scheduler/simulation_throughputs.json",
        "unit": "steps per second",
        "models": models,
        "types": types,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.sched.derive_gavel PATH/simulation_throughputs.json")
        return 2
    raw = json.loads(Path(args[0]).read_text())
    OUT.write_text(json.dumps(derive(raw), separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
