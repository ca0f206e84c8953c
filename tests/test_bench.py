"""bench_attention.py: the --compare loader (a revision given as a directory brings its own Gluon kernels,
which use that revision's attention_fp8), the inputs of --model-layout and --mean, and the figures it
publishes, computed on CPU."""
import contextlib
import inspect
import json
import os
import shutil
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel

import attention_fp8
import bench_attention as B

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_compare_directory_revision_imports_its_own_gluon_module(tmp_path):
    for name in ("attention_fp8.py", "attention_fp8_hopper.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    # mark the copy, so that the test can tell which hopper module the revision imports
    with open(tmp_path / "attention_fp8_hopper.py", "a") as f:
        f.write("\nREVISION_MARK = 'copy'\n")
    mod = B.load_revision(str(tmp_path), 91)
    imports = [line.strip() for line in inspect.getsource(mod._forward).splitlines() if "import" in line]
    assert imports and all(line.startswith("import attention_fp8_hopper_rev91 as attention_fp8_hopper")
                           for line in imports), imports
    import attention_fp8_hopper_rev91 as hopper
    assert hopper.REVISION_MARK == "copy"
    assert hopper.attention_fp8 is mod      # and it launches with the revision's _grid and _launch
    single = B.load_revision(os.path.join(ROOT, "attention_fp8.py"), 92)     # a file: the current kernels
    assert "import attention_fp8_hopper " in inspect.getsource(single._forward)


def test_model_layout_inputs(monkeypatch):
    """--model-layout gives (B, H, N, D) tensors laid out in memory as (B, N, H, D), as model.py's are."""
    plain = B.inputs(2, 3, 5, 64, device="cpu")
    monkeypatch.setattr(B, "MODEL_LAYOUT", True)
    model = B.inputs(2, 3, 5, 64, device="cpu")
    for x, y in zip(plain, model):
        assert x.shape == y.shape == (2, 3, 5, 64) and x.is_contiguous()
        assert y.stride() == (5 * 3 * 64, 64, 3 * 64, 1)


def test_mean_inputs(monkeypatch):
    """--mean adds a common mean to v and do only, in either layout."""
    for layout in (False, True):
        monkeypatch.setattr(B, "MODEL_LAYOUT", layout)
        monkeypatch.setattr(B, "MEAN", 1.0)
        shifted = B.inputs(2, 3, 64, 64, device="cpu")
        monkeypatch.setattr(B, "MEAN", 0.0)
        base = B.inputs(2, 3, 64, 64, device="cpu")
        for i, (x, y) in enumerate(zip(base, shifted)):
            assert x.stride() == y.stride()
            assert torch.equal(y, x if i < 2 else (x.float() + 1.0).bfloat16()), i


# ---------------------------------------------------------------------------------------------------
# The figures bench_attention.py publishes (TFLOP/s, ratios to cuDNN, pre-pass share, peak memory, errors
# against FP32), computed on CPU: the GPU-only parts are replaced by fakes that say which method ran.
# triton.testing.do_bench returns a set time per method (by the delta the fp8 kernel was really called
# with, or the SDPA backend really forced); torch.cuda's memory counters a set peak above a set base; the
# SDPA backends that CPU lacks run as math (cuDNN, the FP32 reference) or CPU flash (flash). The fp8 kernel
# runs for real (Triton interpreter on CPU) where the errors are measured, and is skipped inside do_bench.
SHAPE = (1, 2, 64, 64)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"     # the fp8 kernel: on the GPU, or the interpreter on CPU
CAUSAL_FLOPS = 4 * 1 * 2 * 64 * 64 * 64 / 2    # forward FLOPs of SHAPE, causal: half the full matrix
FWD = {"fp8_matched": 0.5, "fp8_stale": 0.5, "cudnn": 0.8, "flash": 1.6, "old_matched": 1.0, "old_stale": 1.0}
FWDBWD = {"fp8_matched": 4.0, "fp8_stale": 3.0, "cudnn": 2.5, "flash": 5.0, "old_matched": 6.0, "old_stale": 4.5}
ROUND_FACTORS = [1.0, 1.5, 0.9]     # the k-th timing of a (method, pass) is its time x ROUND_FACTORS[k % 3]: median 1
BASE_BYTES = 2**30
PEAK_BYTES = {"fp8_matched": 3 * 2**20, "fp8_stale": 3 * 2**20, "cudnn": 5 * 2**20, "flash": 6 * 2**20}
SDPA_NAMES = {SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.FLASH_ATTENTION: "flash",
              SDPBackend.EFFICIENT_ATTENTION: "reference"}
CPU_BACKEND = {SDPBackend.CUDNN_ATTENTION: SDPBackend.MATH, SDPBackend.FLASH_ATTENTION: SDPBackend.FLASH_ATTENTION,
               SDPBackend.EFFICIENT_ATTENTION: SDPBackend.MATH}


@pytest.fixture
def fake_gpu(monkeypatch):
    real_attention, real_inputs = attention_fp8.attention, B.inputs
    state = types.SimpleNamespace(calls=[], dry=False, prof=None, events=[], counts={}, scale=1.0)

    def attention(q, k, v, causal=False, delta="matched", **kw):
        state.calls.append(f"fp8_{delta}")
        if state.prof is not None:
            state.prof.extend(KERNEL_EVENTS[delta])
        if state.dry or state.prof is not None:
            return q + k + v        # timing only: the kernel's cost is the fake clock's
        return real_attention(q, k, v, causal=causal, delta=delta, **kw)

    @contextlib.contextmanager
    def fake_sdpa_kernel(backend):
        state.calls.append(SDPA_NAMES[backend])
        with sdpa_kernel(CPU_BACKEND[backend]):
            yield

    def do_bench(fn, warmup=None, rep=None, grad_to_none=None, **kw):
        graph = getattr(fn, "__self__", None)
        kind = "graph" if isinstance(graph, FakeGraph) else "fwd" if not torch.is_grad_enabled() else "fwdbwd"
        for x in grad_to_none or []:
            x.grad = None
        state.calls.clear()
        dry, state.dry = state.dry, True
        try:
            fn()
        finally:
            state.dry = dry
        who = state.calls[-1]
        # forward+backward timed without grad_to_none adds a gradient-accumulation kernel to every call
        assert kind != "fwdbwd" or len(grad_to_none or []) == 3, f"{who}: fwd+bwd timed with grad_to_none={grad_to_none}"
        n = state.counts[who, kind] = state.counts.get((who, kind), -1) + 1
        table = {"fwd": FWD, "fwdbwd": FWDBWD, "graph": GRAPH}[kind]
        return table[who] * ROUND_FACTORS[n % 3] * state.scale

    monkeypatch.setattr(attention_fp8, "attention", attention)
    monkeypatch.setattr(B, "sdpa_kernel", fake_sdpa_kernel)
    monkeypatch.setattr(B, "inputs", lambda *a, **k: real_inputs(*a, **{**k, "device": DEVICE}))
    monkeypatch.setattr(B.triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: BASE_BYTES)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: BASE_BYTES + PEAK_BYTES[state.calls[-1]])
    state.real_attention = real_attention
    return state


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def test_rel_err_is_relative_to_the_reference():
    ref = torch.tensor([3.0, 4.0])
    assert B.rel_err(torch.tensor([6.0, 8.0]), ref) == pytest.approx(1.0)
    assert B.rel_err(torch.tensor([3.0, 4.0]).bfloat16(), ref) == 0.0
    assert B.rel_err(torch.tensor([0.0, 0.0]), ref) == pytest.approx(1.0)


@pytest.mark.parametrize("causal", [True, False])
def test_bench_shape_figures(fake_gpu, causal):
    """bench_shape's row: TFLOP/s as FlashAttention counts them (forward 4BHN^2D, half that causal;
    forward+backward 3.5x that), the pre-pass share 1 - stale/matched of forward+backward time, the stale
    arm timed on the stale kernel, peak memory above the base in MiB, and each method's error against an
    FP32 reference of the same mask with the same dO, per tensor."""
    row = B.bench_shape(*SHAPE, causal=causal)
    flops = CAUSAL_FLOPS * (1 if causal else 2)
    assert set(row) == {"shape", "causal", "fp8_matched", "fp8_stale", "cudnn", "flash", "prepass_share"}
    for m in ("fp8_matched", "fp8_stale", "cudnn", "flash"):
        r = row[m]
        assert r["fwd_ms"] == FWD[m] and r["fwdbwd_ms"] == FWDBWD[m], (m, r)
        assert r["fwd_tflops"] == pytest.approx(tflops(flops, FWD[m]), rel=1e-12), m
        assert r["fwdbwd_tflops"] == pytest.approx(tflops(3.5 * flops, FWDBWD[m]), rel=1e-12), m
        assert r["peak_mib"] == PEAK_BYTES[m] / 2**20, m
    assert row["prepass_share"] == pytest.approx((4.0 - 3.0) / 4.0)

    # errors: recomputed here, each method against an FP32 reference of the same inputs and dO
    q, k, v, do = B.inputs(*SHAPE)
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    of.backward(do.float())
    ref = {"o": of.detach(), "dq": qf.grad, "dk": kf.grad, "dv": vf.grad}
    runs = {"fp8_matched": lambda q, k, v: fake_gpu.real_attention(q, k, v, causal=causal, delta="matched"),
            "fp8_stale": lambda q, k, v: fake_gpu.real_attention(q, k, v, causal=causal, delta="stale")}
    for m, backend in (("cudnn", SDPBackend.MATH), ("flash", SDPBackend.FLASH_ATTENTION)):
        def run(q, k, v, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        runs[m] = run
    for m, f in runs.items():
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        o = f(qg, kg, vg)
        o.backward(do)
        for n, x in (("o", o.detach()), ("dq", qg.grad), ("dk", kg.grad), ("dv", vg.grad)):
            want = ((x.float() - ref[n]).norm() / ref[n].norm()).item()
            assert 0 < want < 0.2 and row[m][f"err_{n}"] == pytest.approx(want, rel=1e-6), (m, n, row[m])
    # the two deltas differ in the backward only: same O, other gradients
    assert row["fp8_stale"]["err_o"] == row["fp8_matched"]["err_o"]
    assert row["fp8_stale"]["err_dk"] != row["fp8_matched"]["err_dk"]


def test_print_table_columns(capsys):
    """The printed table: ratios are fp8 over cuDNN of the same pass, the pre-pass share in percent, the
    error columns in the header's order."""
    errs = lambda base: {f"err_{t}": base + i * 0.001 for i, t in enumerate(("o", "dq", "dk"))}
    row = {"shape": "1x2x64x64", "causal": True, "prepass_share": 0.2,
           "fp8_matched": {"fwd_tflops": 300, "fwdbwd_tflops": 240, "peak_mib": 10, **errs(0.01)},
           "fp8_stale": {"fwd_tflops": 300, "fwdbwd_tflops": 250, "peak_mib": 10, **errs(0.02)},
           "cudnn": {"fwd_tflops": 400, "fwdbwd_tflops": 400, "peak_mib": 20, **errs(0.03)},
           "flash": {"fwd_tflops": 150, "fwdbwd_tflops": 100, "peak_mib": 30}}
    B.print_table([row])
    lines = capsys.readouterr().out.splitlines()
    main = next(line for line in lines if line.strip().startswith("1x2x64x64"))
    _, fwd, fwdbwd, peak = main.split("|")
    assert fwd.split() == ["300", "400", "150", "0.75"], main
    assert fwdbwd.split() == ["240", "250", "400", "100", "0.60", "20.0%"], main
    assert peak.split() == ["10", "/", "20"], main
    header = next(line for line in lines if line.startswith("relative error"))
    cols = header.split("(Frobenius)")[1].split()
    assert list(zip(cols[::2], cols[1::2])) == [(m, t) for m in ("matched", "stale", "cudnn") for t in ("O", "dQ", "dK")]
    err = lines[lines.index(header) + 1].split()
    assert err[:2] == ["1x2x64x64", "y"] and [float(x) for x in err[2:]] == [
        0.010, 0.011, 0.012, 0.020, 0.021, 0.022, 0.030, 0.031, 0.032], err


@pytest.mark.parametrize("causal", [True, False])
def test_compare_figures(fake_gpu, monkeypatch, causal):
    """--compare: medians of the interleaved rounds, speedups of each label against the first (old over
    label), the stale rounds on the stale kernel, the pre-pass share over matched time, 3.5x FLOPs."""
    old = types.SimpleNamespace(attention=lambda q, k, v, causal=False, delta="matched":
                                (fake_gpu.calls.append(f"old_{delta}"), q + k + v)[1])
    monkeypatch.setattr(B, "revisions", lambda files: [("old", old), ("current", attention_fp8)])
    fake_gpu.dry = True     # timing only
    timed, bench = [], B.triton.testing.do_bench
    monkeypatch.setattr(B.triton.testing, "do_bench", lambda fn, **kw: (bench(fn, **kw), timed.append(
        fake_gpu.calls[-1].split("_")[0]))[0])
    rows = B.compare([], ["x".join(map(str, SHAPE))], causal, rounds=3)
    # the rounds alternate the order of the methods, so that none is always timed first (or last)
    per_round = [list(dict.fromkeys(timed[r * 8:(r + 1) * 8])) for r in range(3)]  # 3 + 3 + 2 timings each
    assert per_round == [["old", "fp8", "cudnn"], ["cudnn", "fp8", "old"], ["old", "fp8", "cudnn"]], timed
    flops = CAUSAL_FLOPS * (1 if causal else 2)
    assert [r["label"] for r in rows] == ["old", "current", "cudnn"]
    for r, key in zip(rows, ("old", "fp8", "cudnn")):
        matched = f"{key}_matched" if key != "cudnn" else "cudnn"
        assert r["fwd_ms"] == FWD[matched] and r["fwdbwd_ms"] == FWDBWD[matched], r
        assert r["fwd_tflops"] == pytest.approx(tflops(flops, FWD[matched]), rel=1e-12), r
        assert r["fwdbwd_tflops"] == pytest.approx(tflops(3.5 * flops, FWDBWD[matched]), rel=1e-12), r
        assert r["fwd_speedup"] == pytest.approx(FWD["old_matched"] / FWD[matched]), r
        assert r["fwdbwd_speedup"] == pytest.approx(FWDBWD["old_matched"] / FWDBWD[matched]), r
        if key == "cudnn":
            assert r["prepass_share"] != r["prepass_share"], r     # nan: no stale cuDNN
        else:
            m, s = FWDBWD[f"{key}_matched"], FWDBWD[f"{key}_stale"]
            assert r["prepass_share"] == pytest.approx((m - s) / m), r
    assert rows[1]["fwd_speedup"] == 2.0        # the current forward takes half the old one's time


KERNEL_EVENTS = {   # (kernel name, GPU us) per forward+backward call
    "matched": [("_fwd_kernel", 100.0), ("_bwd_dq_kernel", 70.0), ("_bwd_dkdv_kernel", 80.0), ("_quantize_q", 10.0),
                ("memset", 5.0)],
    "stale": [("_fwd_kernel", 100.0), ("_bwd_dq_kernel", 50.0), ("_bwd_dkdv_kernel", 80.0), ("_quantize_q", 10.0),
              ("memset", 5.0)],
}


def test_compare_kernels_prepass_share(fake_gpu, monkeypatch, capsys):
    """--kernels: GPU us per call by kernel kind and in all, and the pre-pass's share of the matched GPU time,
    (matched - stale) / matched, from profiler events: medians of rounds that alternate the order."""
    order, sessions = [], {}

    class Profile:
        def __init__(self, activities=None):
            pass

        def __enter__(self):
            fake_gpu.prof, self.start = [], len(fake_gpu.calls)
            return self

        def __exit__(self, *exc):
            who = set(fake_gpu.calls[self.start:])
            assert len(who) == 1, who
            who = who.pop()
            order.append(who)
            # the k-th profile of a method runs ROUND_FACTORS[k % 3] times as long: the median is the set time
            k = sessions[who] = sessions.get(who, -1) + 1
            fake_gpu.events = [(name, t * ROUND_FACTORS[k % 3]) for name, t in fake_gpu.prof]
            fake_gpu.prof = None

        def events(self):
            return [types.SimpleNamespace(device_type=DeviceType.CUDA, name=name,
                                          time_range=types.SimpleNamespace(elapsed_us=lambda t=t: t))
                    for name, t in fake_gpu.events]
    monkeypatch.setattr(B, "torch_profile", Profile)
    B.compare_kernels([], ["x".join(map(str, SHAPE))], True, rounds=3)
    assert order == ["fp8_matched", "fp8_stale", "fp8_stale", "fp8_matched", "fp8_matched", "fp8_stale"], order
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    matched = next(line for line in lines if line.startswith("current:"))
    stale = next(line for line in lines if line.startswith("current stale:"))
    assert "fwd    100.0 (1.000x)" in matched and "dq     70.0 (1.000x)" in matched and "all    265.0" in matched
    assert "dq     50.0 (1.400x)" in stale and "all    245.0 (1.082x)" in stale, stale
    assert stale.endswith(f"pre-pass {20 / 265:.1%} of GPU time"), stale


GRAPH = {"fp8_matched": 2.0, "fp8_stale": 1.5, "cudnn": 1.0, "flash": 1.25}


class FakeGraph:
    """torch.cuda.CUDAGraph: captures which method ran; a replay says that method ran again."""
    calls = None

    def __init__(self):
        self.who = None

    def replay(self):
        FakeGraph.calls.append(self.who)


def fake_graphs(fake_gpu, monkeypatch):
    """CUDA graphs and streams on the fake GPU: a captured graph replays the last method called in it,
    on the fake clock; the times are small enough for TFLOP/s that print as more than 0."""
    FakeGraph.calls = fake_gpu.calls
    fake_gpu.scale = 1e-5

    @contextlib.contextmanager
    def capture(graph):
        yield
        graph.who = fake_gpu.calls[-1]
    stream = lambda *a, **k: types.SimpleNamespace(wait_stream=lambda s: None)
    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", capture)


@pytest.mark.parametrize("causal", [True, False])
def test_graphed_tflops(fake_gpu, monkeypatch, capsys, causal):
    """--graphs: forward+backward TFLOP/s (3.5x the forward count, half of it causal) of the eager and the
    replayed time."""
    fake_graphs(fake_gpu, monkeypatch)
    fake_gpu.dry = True         # every call here is for timing
    B.graphed(["x".join(map(str, SHAPE))], causal)
    out = capsys.readouterr().out.splitlines()
    flops = 3.5 * CAUSAL_FLOPS * (1 if causal else 2)
    for m in ("fp8_matched", "fp8_stale", "cudnn", "flash"):
        line = next(line for line in out if line.split()[:1] == [m]).split()
        assert line[5] == f"{tflops(flops, FWDBWD[m] * 1e-5):.0f}", line
        assert line[8] == f"{tflops(flops, GRAPH[m] * 1e-5):.0f}", line
        assert float(line[5]) > 10 and float(line[8]) > 10, line


def test_graphed_goes_on_past_a_shape_the_fp8_kernel_refuses(fake_gpu, monkeypatch, capsys):
    """--graphs at a head dim the kernel does not take: attention() raises ValueError, which stopped the
    run with a traceback before cuDNN's and flash's rows (only RuntimeError was caught)."""
    fake_graphs(fake_gpu, monkeypatch)     # not dry: the real attention() is what refuses the head dim
    B.graphed(["1x1x64x96"], True)
    out, err = capsys.readouterr()
    assert "fp8_matched 1x1x64x96:" in err and "fp8_stale 1x1x64x96:" in err, err
    assert [line.split()[0] for line in out.splitlines() if line.strip()] == ["method", "cudnn", "flash"], out


@pytest.mark.parametrize("argv,message", [
    (["--shapes", "8x16x1024x64", "4x16x4096"], "--shapes 4x16x4096: expected BxHxNxD"),
    (["--shapes", "0x16x1024x64"], "--shapes 0x16x1024x64: expected BxHxNxD"),
    (["--rounds", "0", "--compare", "a.py"], "--rounds 0: must be at least 1"),
    (["--kernels", "--json", "k.json"], "--json writes the table's or --compare's rows"),
    (["--graphs", "--sweep"], "--sweep tunes the tilings for the table"),
    (["--kernels", "--graphs"], "--kernels runs with the table's shapes or --compare, not with --profile"),
    (["--kernels", "--profile"], "--kernels runs with the table's shapes or --compare, not with --profile"),
    (["--rounds", "2"], "--rounds is for --compare and --kernels"),
    (["--no-errors", "--compare", "a.py"], "--no-errors is for the table"),
    (["--no-errors", "--graphs"], "--no-errors is for the table"),
    (["--json", "/no/such/folder/rows.json"], "--json /no/such/folder/rows.json: no folder /no/such/folder"),
])
def test_bad_arguments_stop_before_any_run(monkeypatch, capsys, argv, message):
    """Checked when parsed, GPU or not: a bad shape last in the list stopped the run after the others,
    with no table and no JSON; --json beside --kernels was ignored without a word, as were --kernels
    beside --graphs or --profile, --rounds with the table and --no-errors outside it; a --json path in a
    missing folder failed only after every shape had run."""
    monkeypatch.setattr(sys, "argv", ["bench_attention.py", *argv])
    with pytest.raises(SystemExit) as e:
        B.main()
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_json_rows_are_strict_json():
    """cuDNN's row has no pre-pass share (NaN): written as null, which jq and JavaScript read; bare NaN they refuse."""
    rows = [{"shape": "1x1x1x64", "prepass_share": float("nan"), "cudnn": {"fwd_ms": 1.0, "err_o": float("nan")}}]
    text = json.dumps(B.nan_to_none(rows), allow_nan=False)
    assert json.loads(text) == [{"shape": "1x1x1x64", "prepass_share": None, "cudnn": {"fwd_ms": 1.0, "err_o": None}}]


def test_sweep_times_the_triton_kernels_it_tiles(monkeypatch):
    """At the sweep's shapes Hopper runs the Gluon forward and dK/dV kernels, which CONFIGS does not tile:
    the sweep turns them off while it runs (or every candidate timed the same Gluon kernel), then back on."""
    seen = []
    monkeypatch.setattr(B, "_sweep", lambda kernels, jit_fns: seen.append((B.A.HOPPER_FORWARD, B.A.HOPPER_BACKWARD)))
    before = B.A.HOPPER_FORWARD, B.A.HOPPER_BACKWARD
    assert before[0] and before[1], "test setup: the Gluon kernels should be on for some head dims"
    B.sweep(["fwd", "dkdv"])
    assert seen == [((), ())] and (B.A.HOPPER_FORWARD, B.A.HOPPER_BACKWARD) == before


def test_revisions_put_the_current_kernels_last(monkeypatch):
    """--compare's speedups are against the first label: the first FILE given, with the current kernels last."""
    monkeypatch.setattr(B, "load_revision", lambda path, i: f"module {i}")
    assert B.revisions(["old/attention_fp8.py", "wt/rev12/"]) == [
        ("attention_fp8.py", "module 0"), ("rev12", "module 1"), ("current", attention_fp8)]


def test_revisions_of_one_name_get_labels_of_their_own(monkeypatch):
    """compare() keeps times by label: two attention_fp8.py from different folders (git show REV:... >
    /tmp/REV/attention_fp8.py, twice) shared one label, and each row printed the median of both."""
    monkeypatch.setattr(B, "load_revision", lambda path, i: f"module {i}")
    labels = [label for label, _ in B.revisions(["a/attention_fp8.py", "b/attention_fp8.py", "x/current",
                                                 "b/attention_fp8.py", "cudnn"])]
    assert labels == ["attention_fp8.py", os.path.normpath("b/attention_fp8.py"), os.path.normpath("x/current"),
                      os.path.normpath("b/attention_fp8.py") + " #4", "cudnn #5", "current"]
    assert len(set(labels)) == len(labels)


def test_json_holds_every_shape_row(fake_gpu, monkeypatch, tmp_path):
    """--json writes the rows of every shape, as bench_shape made them, in the order of --shapes."""
    made = []
    real = B.bench_shape
    monkeypatch.setattr(B, "bench_shape", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 0)
    path = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["bench_attention.py", "--no-errors", "--json", str(path),
                                      "--shapes", "1x2x64x64", "1x1x128x64"])
    fake_gpu.dry = True
    B.main()
    written = json.loads(path.read_text())
    rows = written["rows"]
    assert [r["shape"] for r in rows] == ["1x2x64x64", "1x1x128x64"]
    assert rows == json.loads(json.dumps(B.nan_to_none(made)))
    # the settings the rows depend on, which only the printed log's header held before
    settings = written["settings"]
    assert settings["gpu"] == "fake GPU" and settings["torch"] == torch.__version__ and settings["causal"] is True
    assert (settings["mean"], settings["model_layout"], settings["errors"]) == (0.0, False, False)
    assert settings["command"].endswith("--shapes 1x2x64x64 1x1x128x64")
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f], "a temporary file was left behind"
