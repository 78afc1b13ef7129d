"""The agreement step of scripts/gpu_check.sh: the Java CUDA device's losses against the NumPy runner (LeNet, each
way) and the PyCUDA runner (ResNet-50, own and vendor: its first two losses judged, the later ones reported), LeNet's
with the graph against those without, and each run's measured GPU memory against the plan. Writes agreement.json
into OUTDIR; exit status 1 where a judged loss differs by more than 1e-4 (relative), or a Java run or its reference
left no losses. A Java run or a reference that did not run at all (a step the deadline left out, which
summary.txt reports as such) is not judged.

    python scripts/gpu_agreement.py OUTDIR LENET_SETS RESNET_SETS DRY_RUN(0|1)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from deepdsl import api

# ResNet-50 on random data amplifies rounding from the third step on (NumPy's float32 and float64 losses part by 2% at
# the second step at batch 4, 64x64): its first two losses (the forward pass, and the forward pass after one whole
# update) measure the kernels; the later ones are reported, not judged
JUDGED = {"lenet": None, "resnet50": 2}


def load(out: Path, name: str) -> dict:
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except Exception as err:  # noqa: BLE001  (a run that failed, or did not run, left nothing to read)
        return {"error": f"{name}: {err}"}


def rel(a: list[float], b: list[float]) -> float | None:
    n = min(len(a), len(b))
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n])) if n else None


def main() -> None:
    out = Path(sys.argv[1])
    sets = {net: dict(w.split("=") for w in words.split() if w != "--set")
            for net, words in zip(("lenet", "resnet50"), sys.argv[2:4])}  # fmt: skip
    sets = {net: {k: int(v) for k, v in s.items()} for net, s in sets.items()}
    dry = sys.argv[4] == "1"
    report, unjudged = {}, []
    for key, net, java, refs in [
        ("lenet", "lenet", "java_lenet.json", ["numpy_lenet.json"]),
        ("lenet_cublas", "lenet", "java_lenet_cublas.json", ["numpy_lenet.json"]),
        # the step call for call against its CUDA graph (java_lenet.json)
        ("lenet_nograph", "lenet", "java_lenet_nograph.json", ["numpy_lenet.json", "java_lenet.json"]),
        ("resnet50", "resnet50", "java_resnet50.json", [] if dry else ["pycuda_resnet50_own.json"]),
        ("resnet50_vendor", "resnet50", "java_resnet50_vendor.json", [] if dry else ["pycuda_resnet50_vendor.json"]),
    ]:
        if not (out / java).exists():  # not run (an optional step the deadline left out): nothing to judge
            continue
        j = load(out, java)
        c = api.compile_file(f"networks/{net}.ddsl", sets[net], stop_at="plan")
        params = sum(p.value.type.nbytes for p in c.plan.graph.params)
        row = {"java": j, "planned_arena_bytes": c.plan.arena_bytes, "planned_tensor_bytes": params}
        for ref in refs:
            if not (out / ref).exists():  # its step was not run (the deadline): reported, not judged
                row[ref] = {"error": "not run"}
                continue
            r = load(out, ref)
            row[ref] = r
            if "losses" in j and "losses" in r:
                n = JUDGED[net]
                row[f"max_rel_diff_vs_{ref.removesuffix('.json')}"] = rel(j["losses"][:n], r["losses"][:n])
                if n is not None:
                    row[f"later_rel_diff_vs_{ref.removesuffix('.json')}"] = rel(j["losses"][n:], r["losses"][n:])
            else:  # a reference or a Java run without losses: nothing judged, which is no pass
                row[f"max_rel_diff_vs_{ref.removesuffix('.json')}"] = None
                unjudged.append(f"{key} against {ref}")
        if "gpu_memory_bytes" in j:
            row["measured_minus_planned_bytes"] = j["gpu_memory_bytes"] - c.plan.arena_bytes - params
        report[key] = row
    (out / "agreement.json").write_text(json.dumps(report, indent=2))
    bad = [f"{net} {k}={v:.2e}" for net, row in report.items() for k, v in row.items()
           if k.startswith("max_rel_diff") and v is not None and v > 1e-4]  # fmt: skip
    for net, row in report.items():
        print(net, {k: v for k, v in row.items() if k.startswith(("max_rel", "later_rel", "measured", "planned"))})
    if bad:
        print("differ by more than 1e-4:", "; ".join(bad))
    if unjudged:
        print("no losses to compare:", "; ".join(unjudged))
    sys.exit(1 if bad or unjudged or not report or any("error" in row["java"] for row in report.values()) else 0)


if __name__ == "__main__":
    main()
