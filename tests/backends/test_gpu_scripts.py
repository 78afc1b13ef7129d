"""The GPU check's scripts without a GPU: scripts/profile_gpu.py and scripts/bench_gpu.py's watched `deepdsl run` on
the emulated driver (tests/backends/cuda_emulator.py) with the stand-in cuBLAS and cuDNN, bench_gpu's rows, ratios
and goals, and the deadline of scripts/gpu_check.sh (scripts/gpu_steps.sh)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver, fake_vendor
from helpers import ROOT

from deepdsl import api, running
from deepdsl.backends.cuda.vendor import open_vendor
from deepdsl.memory.report import flops

sys.path.insert(0, str(ROOT / "scripts"))
import bench_gpu  # noqa: E402
import gpu_nccl_check  # noqa: E402
import profile_gpu  # noqa: E402

needs_gcc = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++")
LENET = ROOT / "networks" / "lenet.ddsl"


@pytest.fixture(scope="module")
def vendor_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vendor(tmp_path_factory.mktemp("vendor"))


# ---- profile_gpu.py ----


@needs_gcc
def test_the_profile_sums_every_launch_by_op_with_flops_and_bytes(tmp_path: Path, vendor_folder: Path) -> None:
    c = api.compile_file(LENET, {"N": 2}, stop_at="plan")
    driver = EmulatedDriver(tmp_path, vendor=open_vendor("vendor", [vendor_folder]))
    runner, feeds = profile_gpu.runner_for(c, "vendor", driver)
    try:
        p = profile_gpu.profile(c, runner, feeds, warmup=1, repeats=1)
    finally:
        runner.close()
    assert p["graph"] == "on" and p["launch_count"] == len(runner.calls["train"])
    by_op = p["tables"]["by op"]
    assert sum(r["launches"] for r in by_op) == p["launch_count"]
    assert sum(r["ms"] for r in by_op) == pytest.approx(p["launches_ms"])
    # every statement's FLOPs counted once, in the launch that computes it (an epilogue launched alone: in its own
    # launch): the table adds up to memcheck's count
    assert sum(r["flops"] for r in by_op) == flops(c.plan.graph) == p["train_flops"]
    epilogues = [r for r in by_op if r["name"].endswith(" epilogue")]
    assert epilogues and all(r["flops"] > 0 for r in epilogues)
    assert all(x["bytes"] > 0 for x in p["launches"])
    conv = next(r for r in by_op if r["name"] == "conv2d")
    assert conv["tflops"] == pytest.approx(conv["flops"] / (conv["ms"] / 1e3) / 1e12)
    # each cuDNN convolution as bound: its algorithm, its workspace and its shapes
    convs = [v for v in p["vendor_calls"] if v["op"].startswith("conv2d")]
    assert len(convs) == 5 and all(v["what"].startswith("cudnnConvolution") for v in convs)
    assert all(isinstance(v["workspace"], int) and v["call"].startswith("Conv") for v in convs)
    assert p["vendor_scratch_bytes"] == runner.vendor_scratch_bytes
    json.dumps(p)  # what --json writes


# ---- bench_gpu.py: our rows through a watched `deepdsl run` ----


@needs_gcc
@pytest.mark.slow  # 7 s: the emulated driver builds LeNet's training, inference and test kernels
def test_the_watched_run_reports_device_times_graph_and_vendor_calls(
    tmp_path: Path, vendor_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drivers = []

    def emulated(device: str, double: bool = False, kernels: str = "auto", tf32: bool = False):  # noqa: ANN202
        drivers.append(EmulatedDriver(tmp_path / "kernels", vendor=open_vendor(kernels, [vendor_folder])))
        return drivers[-1], "the emulated GPU (test)", None

    monkeypatch.setattr(running, "open_device", emulated)
    out = tmp_path / "row.json"
    bench_gpu.child(str(out), ["run", str(LENET), "--set", "N=2", "--device", "cuda", "--kernels", "vendor", "--data",
                               "synthetic", "--iters", "3", "--json"])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["exit"] == 0 and report["error"] is None
    assert len(report["train_seconds"]) == 3 and len(report["cli"]["losses"]) == 3
    assert report["runner"]["graph"] == "on" and report["runner"]["device"] == EmulatedDriver.description
    assert report["runner"]["planned_bytes"] > 0
    assert {v["what"].split()[0] for v in report["vendor_calls"]} >= {"cudnnConvolutionForward", "cuBLAS"}
    assert drivers[0].replays == 2  # the graph replayed from the second step on: what was timed


@needs_gcc
@pytest.mark.slow  # 7 s: as above
def test_the_watched_run_profiles_its_last_steps_kernel_by_kernel_and_times_the_others(
    tmp_path: Path, vendor_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """BENCH_GPU_KERNEL_PROFILE=N: the last N train steps run under the profiler (here a stand-in, PyTorch being
    absent), they are not among the timed steps, and the report carries the profile."""
    monkeypatch.setattr(running, "open_device", lambda device, double=False, kernels="auto", tf32=False: (
        EmulatedDriver(tmp_path / "kernels", vendor=open_vendor(kernels, [vendor_folder])), "emulated (test)",
        None))  # fmt: skip
    started: list[object] = []
    monkeypatch.setattr(bench_gpu, "start_kernel_profile", lambda: started.append(object()) or started[-1])
    monkeypatch.setattr(bench_gpu, "stop_kernel_profile", lambda prof, steps: {"stopped": prof in started,
                                                                               "steps": steps})  # fmt: skip
    monkeypatch.setenv(bench_gpu.KERNEL_PROFILE, "2")
    out = tmp_path / "row.json"
    bench_gpu.child(str(out), ["run", str(LENET), "--set", "N=2", "--device", "cuda", "--kernels", "vendor", "--data",
                               "synthetic", "--iters", "5", "--json"])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["exit"] == 0 and len(report["cli"]["losses"]) == 5
    assert len(report["train_seconds"]) == 3 and len(started) == 1
    assert report["kernel_profile"] == {"stopped": True, "steps": 2}


def test_the_kernel_summary_finds_cudnns_layout_conversions() -> None:
    """cuDNN's own transposes around a tensor-core convolution of NCHW data count as layout conversions; its NHWC
    convolution kernels (whose names say nhwc) and everything not a kernel do not."""
    conv = "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1"
    events = [
        {"cat": "kernel", "name": "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true>(...)",
         "dur": 300.0},
        {"cat": "kernel", "name": conv, "dur": 1200.0},
        {"cat": "kernel", "name": "void cudnn::ops::nhwcToNchwKernel<float, float, float, true, false>(...)",
         "dur": 100.0},
        {"cat": "kernel", "name": conv, "dur": 1200.0},
        {"cat": "kernel", "name": "dd_k_relu_3", "dur": 200.0},
        {"cat": "cuda_runtime", "name": "cuLaunchKernel", "dur": 5000.0},
        {"ph": "M", "name": "process_name"},
    ]  # fmt: skip
    got = bench_gpu.kernel_summary(events, steps=2)
    assert got["kernels"] == 4 and got["ms_per_step"] == pytest.approx(1.5)
    assert got["layout_conversion_ms_per_step"] == pytest.approx(0.2)
    assert got["layout_conversion_share"] == pytest.approx(0.2 / 1.5)
    names = [k.split("::")[-1][:16] for k in got["layout_conversion_kernels"]]
    assert names == ["nchwToNhwcKernel", "nhwcToNchwKernel"]
    assert got["top"][0] == {"kernel": conv, "ms": pytest.approx(1.2)}


def test_a_watched_run_the_cli_refuses_says_so(tmp_path: Path) -> None:
    out = tmp_path / "row.json"
    bench_gpu.child(str(out), ["run", str(LENET), "--no-such-flag"])
    report = json.loads(out.read_text())
    assert report["exit"] == 2 and "no-such-flag" in report["error"] and report["train_seconds"] == []


def test_a_flag_is_found_in_the_help_as_a_whole_word() -> None:
    usage = "  --precision [fp32|tf32|bf16]  The precision.\n  --graph / --no-graph  On the GPU ...\n"
    assert bench_gpu.takes(usage, "--precision") and bench_gpu.takes(usage, "--no-graph")
    assert not bench_gpu.takes(usage, "--graph-x") and not bench_gpu.takes(usage, "--ranks")
    assert not bench_gpu.takes("  --precision-mode X", "--precision")
    assert bench_gpu.takes(bench_gpu.deepdsl_help(), "--workspace-limit")  # this build's own `deepdsl run --help`


def _bench(tmp_path: Path, usage: str, deadline_at: float | None = None, **args: str) -> bench_gpu.Bench:
    ns = argparse.Namespace(**{"steps": 4, "java": None, "cp": None, "deadline_at": deadline_at} | args)
    b = bench_gpu.Bench(ns, bench_gpu.Report(str(tmp_path / "bench.json"), False), usage, have_torch=False)
    b.name, b.sets, b.cls, b.steps, b.margin, b.limit, b.work = "lenet", {"N": 64}, "LeNet", 4, 8, 90, 1
    return b


def test_a_row_whose_flag_this_build_lacks_is_not_available_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_gpu, "ours", lambda *a: pytest.fail("a row without its flag must not run"))
    b = _bench(tmp_path, "  --workspace-limit SIZE\n")
    b.ours("pycuda_vendor_tf32")
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["skipped"] for r in rows] == ["not available in this build (deepdsl run takes no --precision)"]
    assert all("ms" not in r for r in rows)


def test_the_one_rank_nccl_rows_run_the_data_parallel_java_program_against_its_plain_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = []

    def fake(java_bin, cp, cls, steps, kernels, flags, timeout, jvm=None, env=None):  # noqa: ANN001, ANN202
        started.append((cp, flags, jvm, env))
        losses = [2.5, 2.0] if flags == ["--no-graph"] else [2.5, 2.125] if "--micro-batches" in flags else [2.5, 2.25]
        return {"ms": 2.0 if jvm else 1.0, "losses": losses}

    monkeypatch.setattr(bench_gpu, "java", fake)
    nccl = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    nccl.mkdir(parents=True)
    (nccl / "libnccl.so.2").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path / "site")])
    b = _bench(tmp_path, "", java="java", dp_cp="dp:jars/*")
    for name in bench_gpu.JAVA_DP:
        b.java_dp(name)
    micro = ["--micro-batches", "2"]  # the Java CUDA device's gradient accumulation, plain and through NCCL
    assert [(cp, flags, jvm) for cp, flags, jvm, _ in started] == [
        ("dp:jars/*", [], []), ("dp:jars/*", [], ["-Ddeepdsl.collective=true"]),
        ("dp:jars/*", ["--no-graph"], ["-Ddeepdsl.collective=true"]), ("dp:jars/*", micro, []),
        ("dp:jars/*", micro, ["-Ddeepdsl.collective=true"])]  # fmt: skip
    assert started[1][3]["LD_LIBRARY_PATH"].split(":")[0] == str(nccl)
    bench_gpu.derived(b.report)
    rows = {r["name"]: r for r in b.report.doc["rows"]}
    assert rows["java_dp_nccl"]["losses_equal_to_plain"] is True and rows["java_dp_nccl"]["ms_over_plain"] == 2.0
    assert rows["java_dp_nccl_nograph"]["losses_equal_to_plain"] is False
    assert rows["java_dp_nccl"]["plain_row"] == "java_dp_plain"
    # the NCCL run of two micro-batches against the plain run of two micro-batches, not the one-batch plain run
    assert rows["java_dp_nccl_micro2"]["plain_row"] == "java_dp_micro2"
    assert rows["java_dp_nccl_micro2"]["losses_equal_to_plain"] is True


def test_without_libnccl_the_nccl_rows_say_so_and_run_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []
    monkeypatch.setattr(bench_gpu, "java", lambda *a, **k: ran.append(a[5]) or {"ms": 1.0, "losses": [1.0]})
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    b = _bench(tmp_path, "", java="java", dp_cp="dp")
    for name in bench_gpu.JAVA_DP:
        b.java_dp(name)
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert ran == [[], ["--micro-batches", "2"]]  # the runs without NCCL only
    assert [r.get("skipped") for r in rows] == [None, bench_gpu.NO_NCCL, bench_gpu.NO_NCCL, None, bench_gpu.NO_NCCL]
    assert all("ms" not in r for r in rows if r.get("skipped"))
    assert _bench(tmp_path, "", java="java").java_dp("java_dp_plain") is None  # no --dp-cp: no rows


def test_past_the_deadline_a_row_is_skipped_and_the_report_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_gpu, "ours", lambda *a: pytest.fail("no row starts past the deadline"))
    b = _bench(tmp_path, "", deadline_at=time.time() + 5)  # less than the 8 s a LeNet row needs
    b.ours("pycuda_vendor")
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["rows"][0]["skipped"] == "SKIPPED (deadline)"
    assert doc["goals"][2]["met"] is None and "pycuda_vendor: SKIPPED (deadline)" in doc["goals"][2]["why"]


def test_every_ratio_is_ours_over_pytorchs_of_the_same_network_and_the_goals_are_judged(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    first = bench_gpu.Report(str(path), False)
    for network, name, side, ms in [("resnet50", "torch_fp32_benchmark", "pytorch", 100.0),
                                    ("resnet50", "torch_default_benchmark", "pytorch", 40.0),
                                    ("lenet", "torch_fp32_benchmark", "pytorch", 2.0),
                                    ("resnet50", "pycuda_vendor", "ours", 80.0),
                                    ("resnet50", "java_vendor", "ours", 95.0)]:  # fmt: skip
        first.add({"network": network, "name": name, "side": side, "ms": ms})
    later = bench_gpu.Report(str(path), True)  # the optional part, appended
    later.add({"network": "resnet50", "name": "pycuda_own", "side": "ours", "ms": 400.0})
    later.add({"network": "resnet50", "name": "pycuda_vendor_tf32", "side": "ours", "error": "refused"})
    doc = json.loads(path.read_text())
    rows = {(r["network"], r["name"]): r for r in doc["rows"]}
    assert rows["resnet50", "pycuda_vendor"]["vs"] == {"torch_fp32_benchmark": 0.8, "torch_default_benchmark": 2.0}
    assert rows["resnet50", "pycuda_own"]["vs"]["torch_fp32_benchmark"] == 4.0
    goals = {g["goal"].split(" <=")[0].split(" within")[0]: g for g in doc["goals"]}
    assert len(goals) == len(doc["goals"]) == len(bench_gpu.GOALS) + 1
    assert goals["ResNet-50 cuBLAS+cuDNN, PyCUDA runner"]["met"] is True
    assert goals["ResNet-50 cuBLAS+cuDNN, Java CUDA device"]["met"] is False  # 0.95
    assert goals["ResNet-50 Java CUDA device"]["met"] is False  # 95 / 80: 19% off the PyCUDA runner
    assert goals["ResNet-50 own kernels"]["met"] is False and goals["ResNet-50 own kernels"]["ratio"] == 5.0
    tf32 = goals["ResNet-50 --precision tf32"]
    assert tf32["met"] is None and "pycuda_vendor_tf32: refused" in tf32["why"]
    assert goals["LeNet cuBLAS+cuDNN, PyCUDA runner"]["met"] is None
    assert goals["ResNet-50 measured GPU memory"]["met"] is None  # the row carries no runner facts


@pytest.mark.parametrize(("ops", "kernel", "cls"), [
    (["aten::cudnn_convolution", "aten::_convolution"], "sm90_xmma_fprop_implicit_gemm_f32f32", "conv fwd"),
    (["aten::convolution_backward", "ConvolutionBackward0"], "sm90_xmma_dgrad_implicit_gemm_f32f32", "conv dgrad"),
    (["aten::convolution_backward", "ConvolutionBackward0"], "cudnn::wgrad_alg0_engine<float>", "conv wgrad"),
    (["aten::convolution_backward"], "void cudnn::ops::nchwToNhwcKernel<float>", "conv backward, other kernels"),
    (["aten::cudnn_batch_norm_backward", "CudnnBatchNormBackward0"], "bn_bw_1C11_kernel_new", "batch norm"),
    (["aten::_foreach_add_", "Optimizer.step#SGD.step"], "multi_tensor_apply_kernel", "optimiser"),
    (["aten::threshold_backward", "ReluBackward0"], "vectorized_elementwise_kernel", "element-wise and other"),
    (["aten::max_pool2d_with_indices"], "max_pool_forward_nchw", "pooling"),
    (["aten::addmm", "aten::linear"], "sm90_xmma_gemm_f32f32", "gemm (linear)"),
])  # fmt: skip
def test_pytorchs_kernels_fall_in_their_class(ops: list[str], kernel: str, cls: str) -> None:
    assert bench_gpu.kernel_class(ops, kernel) == cls


# ---- gpu_check.sh's deadline (scripts/gpu_steps.sh) ----


def test_the_deadline_stops_a_step_skips_the_rest_and_the_summary_is_written(tmp_path: Path) -> None:
    script = f"""
OUT={tmp_path}
. {ROOT}/scripts/gpu_steps.sh
steps_begin 2
quick() {{ echo quick-ran; }}
fails() {{ return 3; }}
slow() {{ sleep 60 & wait; }}
late() {{ touch "$OUT/late-ran"; }}
run_step quick 30 quick
run_step fails 30 fails
run_step slow 30 slow
run_step late 30 late
run_step --optional "late, optional" 30 late
echo "FAILED=$FAILED" >>"$OUT/summary.txt"
"""
    t0 = time.monotonic()
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert time.monotonic() - t0 < 10  # the step of 60 s was stopped at the deadline, with its child
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert lines[:2] == ["PASS quick", "FAIL fails (status 3)"]
    assert lines[2] in [f"FAIL slow (stopped by the deadline after {s} s)" for s in (1, 2)]
    assert lines[3:] == ["SKIPPED (deadline) late", "SKIPPED (deadline) late, optional", "FAILED=1"]
    assert not (tmp_path / "late-ran").exists() and "quick-ran" in run.stdout


def test_an_optional_step_the_deadline_cuts_fails_nothing(tmp_path: Path) -> None:
    script = f"""
OUT={tmp_path}
. {ROOT}/scripts/gpu_steps.sh
steps_begin 2
quick() {{ true; }}
slow() {{ sleep 60; }}
run_step quick 5 quick
run_step --optional slow 30 slow
echo "FAILED=$FAILED" >>"$OUT/summary.txt"
"""
    subprocess.run(["bash", "-c", script], check=True, timeout=60)
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert lines[0] == "PASS quick" and lines[1].startswith("SKIPPED (deadline) slow (stopped after ")
    assert lines[2] == "FAILED=0"


def test_lenet_compiles_to_java_with_data_parallel(tmp_path: Path) -> None:
    """What gpu_prepare.sh compiles for bench_gpu.py's NCCL rows: LeNet's split reduction passes among the items a
    data-parallel train step cuts into per micro-batch and after the all-reduces (this raised an internal error)."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    r = CliRunner().invoke(cli, ["compile", str(LENET), "--set", "N=8", "--data-parallel", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "allReduce" in (tmp_path / "LeNet.java").read_text()


# ---- gpu_nccl_check.py (the PyCUDA runner over NCCL on the GPU machine) ----


def _nccl_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two: str, init: bool = True,
                drift: str = "") -> tuple[int, dict, list]:  # fmt: skip
    """gpu_nccl_check.main with `subprocess.run` stood in: every run saves the same parameters and losses (the run
    tagged `drift` others), the one-rank runs log NCCL's "Init COMPLETE" where `init`; the two-rank run `two`:
    trains, refuses (NCCL's "Duplicate GPU detected") or crashes."""
    calls = []

    def fake(cmd, capture_output, text, timeout, env, check):  # noqa: ANN001, ANN202
        calls.append((cmd, env))
        path = Path(cmd[cmd.index("--save") + 1])
        tag = path.stem
        w = np.full(3, 2.0 if tag == drift else 1.0, np.float32)
        np.savez(path, w=w)
        stdout, stderr, rc = json.dumps({"losses": [2.5, 2.0], "gpu_graph": "on"}), "", 0
        if init and env.get("DEEPDSL_DP_FORCE") == "1":
            stdout = "host:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 1 - Init COMPLETE\n" + stdout
        if tag == "nccl_two_ranks" and two != "trains":
            rc, stdout = 1, ""
            stderr = ("host:2:2 [0] init.cc:1 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
                      "device 1000\nerror: rank 1: ncclCommInitRank failed (invalid usage)") if two == "refuses" \
                else "Traceback: something else"  # fmt: skip
        return subprocess.CompletedProcess(cmd, rc, stdout, stderr)

    monkeypatch.setattr(gpu_nccl_check.subprocess, "run", fake)
    monkeypatch.setattr(gpu_nccl_check, "has_torch", lambda: True)
    monkeypatch.setattr(sys, "argv", ["gpu_nccl_check.py", str(tmp_path), "--set N=64", "5"])
    with pytest.raises(SystemExit) as ended:
        gpu_nccl_check.main()
    return ended.value.code, json.loads((tmp_path / "nccl_pycuda.json").read_text()), calls


@pytest.mark.parametrize("two", ["trains", "refuses"])
def test_the_nccl_check_passes_a_one_rank_run_equal_to_the_plain_one_and_either_two_rank_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two: str
) -> None:
    code, report, calls = _nccl_check(tmp_path, monkeypatch, two)
    assert code == 0 and report["pass"] is True
    assert [c[1:3] for c, _ in calls] == [["-m", "deepdsl"]] + [["-m", "torch.distributed.run"]] * 2 + [
        ["-m", "deepdsl"], ["-m", "torch.distributed.run"]]  # fmt: skip
    assert calls[1][0][3:9] == ["--standalone", "--nproc_per_node=1", "--no-python", sys.executable, "-m", "deepdsl"]
    assert "--no-graph" in calls[2][0] and calls[1][1]["DEEPDSL_DP_FORCE"] == calls[2][1]["DEEPDSL_DP_FORCE"] == "1"
    assert "--micro-batches" in calls[3][0] and "DEEPDSL_DP_FORCE" not in calls[3][1]
    assert calls[4][0][3:8] == ["--standalone", "--nproc_per_node=2", "--no-python", "env", "LOCAL_RANK=0"]  # GPU 0
    if two == "refuses":
        assert report["two_ranks_one_gpu"]["outcome"] == "NCCL refused two ranks on one GPU"
        assert "Duplicate GPU detected" in report["two_ranks_one_gpu"]["nccl_said"][0]
    else:
        assert report["two_ranks_one_gpu"]["against_micro_batches_2"]["equal"] is True


@pytest.mark.parametrize(("two", "init", "drift"), [("crashes", True, ""), ("refuses", False, ""),
                                                    ("refuses", True, "nccl_one_rank_nograph"),
                                                    ("trains", True, "nccl_two_ranks")])  # fmt: skip
def test_the_nccl_check_fails_another_crash_a_run_without_nccl_or_a_differing_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two: str, init: bool, drift: str
) -> None:
    code, report, _ = _nccl_check(tmp_path, monkeypatch, two, init, drift)
    assert code == 1 and report["pass"] is False
    if drift:
        assert report[drift.replace("nccl_two_ranks", "two_ranks_one_gpu")][
            "against_micro_batches_2" if drift == "nccl_two_ranks" else "against_plain"
        ]["parameters_differ"] == ["w"]


def test_without_pytorch_the_nccl_check_says_torchrun_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_nccl_check, "has_torch", lambda: False)
    monkeypatch.setattr(gpu_nccl_check.subprocess, "run", lambda *a, **k: pytest.fail("nothing may run"))
    monkeypatch.setattr(sys, "argv", ["gpu_nccl_check.py", str(tmp_path), "--set N=64", "5"])
    with pytest.raises(SystemExit, match="torchrun is missing"):
        gpu_nccl_check.main()
    assert json.loads((tmp_path / "nccl_pycuda.json").read_text())["pass"] is False
