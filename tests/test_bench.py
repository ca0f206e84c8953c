"""bench_attention.py: the --compare loader (a revision given as a directory brings its own Gluon kernels), and
the inputs of --model-layout and --mean."""
import inspect
import os
import shutil

import torch

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
