"""Test-only shim: make Triton's CPU interpreter (TRITON_INTERPRET=1) round like the GPU.

What the stock interpreter (triton 3.6 and 3.8, ``triton/runtime/interpreter.py``) gets wrong,
silently:

1. float -> fp8 casts (``x.to(tl.float8e4nv)`` / ``tl.float8e5``) go through a bit-twiddling
   ``_convert_float`` that rounds half-up without a sticky bit, drops the carry out of the
   mantissa and does not saturate: ~8-9% of random values differ from the GPU, some by 2x, and
   values above the fp8 maximum become NaN or garbage. fp8 -> float casts also mis-decode the
   special values (e4m3 NaN becomes 480, e5m2 inf/NaN become finite numbers).
2. ``tl.dot`` on bf16 operands hands the raw uint16 bit patterns to ``np.matmul``.
3. fp32 -> bf16 truncates instead of rounding to nearest-even.

What the GPU does (H200, triton 3.6, measured bit for bit): round to nearest-even, and saturate
both fp8 formats (overflow and +-inf -> +-448 for e4m3, +-57344 for e5m2; NaN stays NaN), i.e.
exactly ``torch.clamp(x, -fmax, fmax).to(fp8_dtype)``. That is the PTX Triton emits for sm_90, sm_100
and sm_120 (``cvt.rn.satfinite.e4m3x2.f32``). For Ada (sm_89) it emits ``cvt.rz.f16.f32`` first, then
the fp16 -> e4m3 cast: the fp32 is truncated to fp16 before it is rounded, which differs in about 0.4%
of random values (a reviewer's simulation, 2026-12-07); the shim does not model that.

What ``install()`` changes, in the module ``triton.runtime.interpreter``:

* ``_convert_float`` (every float <-> fp8/bf16 conversion goes through it: ``create_fp_to_fp``,
  ``cast_impl``, ``create_dot``; in 3.8 also ``create_dot_scaled``) is replaced by a converter that
  goes through torch, clamping first when the target is e4m3/e5m2. Types torch cannot represent
  (``tl.float8e4b15``) fall back to the stock converter.
* ``InterpreterBuilder.cast_impl`` (behind ``create_fp_trunc`` / ``create_fp_ext``) sends every
  float -> float conversion through that converter (stock only did so for bf16 <-> fp32 and
  numpy-``astype``-ed the rest, which is wrong for fp64 <-> bf16).
* ``InterpreterBuilder.create_dot`` widens non-fp32 float operands (fp8, bf16, fp16) to fp32
  before ``np.matmul``.
* ``_patch_lang_tensor`` gets an ``__index__`` that numpy >= 2.4 accepts (stock does
  ``int(ndarray)`` on the shape-(1,) arrays that stand for scalars; numpy 2.4 refuses, so every
  ``range()`` over a computed bound raised TypeError). Not a rounding fix, but the same kind:
  without it the interpreter cannot run the kernels at all on a fresh machine.

Only the interpreter is touched, so calling ``install()`` on a GPU machine is harmless: compiled
kernels never use it. Set ``TRITON_INTERPRET=1`` yourself (before the ``@triton.jit`` functions are
defined); ``install()`` does not, so that it cannot turn a GPU run into a CPU one.
"""

import inspect

import numpy as np
import torch
import triton
import triton.language as tl
import triton.runtime.interpreter as _interp
from triton._C.libtriton import ir as _ir

# Formats torch can convert. tl.float8e4b15 has no torch twin (stock converter). The AMD formats
# (e4m3fnuz, e5m2fnuz) round right but their overflow rule was never measured on a GPU. fp64
# sources may round twice (torch narrows double through float); the project casts none.
_TORCH_DTYPE = {
    tl.float8e4nv: torch.float8_e4m3fn,
    tl.float8e5: torch.float8_e5m2,
    tl.float8e4b8: torch.float8_e4m3fnuz,
    tl.float8e5b16: torch.float8_e5m2fnuz,
    tl.bfloat16: torch.bfloat16,
    tl.float16: torch.float16,
    tl.float32: torch.float32,
    tl.float64: torch.float64,
}
# NVIDIA's fp8 casts saturate (cvt.rn.satfinite); torch's overflow rule differs by torch version,
# so clamp before casting. Only the two formats measured on the GPU are listed.
_SATURATE = {tl.float8e4nv: 448.0, tl.float8e5: 57344.0}
# Same-width integer dtypes, to move bit patterns between numpy and torch. The interpreter's
# callers expect unsigned patterns back; torch has no general uint16/uint32, hence two tables.
_TORCH_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
_NP_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}

# What install() replaced: {name: original}. Empty while the shim is not installed.
_originals = {}


def convert_float(input, input_dtype, output_dtype, rounding_mode):
    """Drop-in for ``interpreter._convert_float``: numpy data of ``input_dtype`` (bf16/fp8 held as
    unsigned ints) -> the bit pattern of ``output_dtype``, as unsigned ints of its width."""
    src, dst = _TORCH_DTYPE.get(input_dtype), _TORCH_DTYPE.get(output_dtype)
    if src is None or dst is None:
        return _originals["_convert_float"](input, input_dtype, output_dtype, rounding_mode)
    if rounding_mode not in (None, _ir.ROUNDING_MODE.RTNE, _ir.ROUNDING_MODE.RTZ):
        raise NotImplementedError(f"triton_shim: rounding mode {rounding_mode}")
    in_int, out_int = _TORCH_INT[input_dtype.primitive_bitwidth], _TORCH_INT[output_dtype.primitive_bitwidth]
    data = np.ascontiguousarray(input).reshape(-1)  # reshape: 0-d scalars too
    x = torch.from_numpy(data.view(_NP_UINT[input_dtype.primitive_bitwidth])).view(in_int).view(src)
    y = x
    fmax = _SATURATE.get(output_dtype)
    if fmax is not None:
        y = torch.clamp(y, -fmax, fmax)  # NaN passes through clamp unchanged
    y = y.to(dst)  # torch rounds to nearest-even, sticky bit included
    if rounding_mode == _ir.ROUNDING_MODE.RTZ:
        # Toward zero = nearest-even, then one step back wherever that rounded the magnitude up.
        # Minus one on the integer pattern is one ulp toward zero for either sign.
        away = y.to(x.dtype).abs() > x.abs()  # widening back is exact; NaN compares False
        y = torch.where(away, (y.view(out_int) - 1).view(dst), y)
    out = y.view(out_int).numpy().view(_NP_UINT[output_dtype.primitive_bitwidth])
    return out.reshape(np.shape(input))


def _cast_impl(self, src, dst_type):
    """InterpreterBuilder.cast_impl: float -> float through convert_float, the rest as before."""
    if src.dtype.scalar.is_floating() and dst_type.scalar.is_floating():
        # None = the default rounding (nearest-even); the stock code passes None too.
        data = _interp._convert_float(src.data, src.dtype.scalar, dst_type.scalar, None)
        return _interp.TensorHandle(data.view(_interp._get_np_dtype(dst_type)), dst_type.scalar)
    return _originals["cast_impl"](self, src, dst_type)


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """InterpreterBuilder.create_dot: widen fp8/bf16/fp16 operands to fp32 before np.matmul (stock
    code multiplied bf16 bit patterns as integers). Integer and fp32/fp64 dots are left as they were;
    note that fp32 operands are NOT rounded to tf32 here as the GPU's default input_precision does.
    Nor is the GPU's FP8 accumulation copied: on sm_90 Triton leaves FP8 dots to the tensor cores'
    short accumulator (max_num_imprecise_acc, about 14 bits kept; SPEED.md step 17), where this sums
    in fp32. So the interpreter's FP8 dots are the more exact, and a bug that shows only as a loss of
    accumulation precision is the GPU tests' to catch, not the CPU's."""
    if not (a.dtype.is_floating() and b.dtype.is_floating()):
        return _originals["create_dot"](self, a, b, d, input_precision, max_num_imprecise_acc)

    def widen(h):
        if h.dtype.primitive_bitwidth >= 32:
            return h.data
        return _interp._convert_float(h.data, h.dtype, tl.float32, None).view(np.float32)

    out = np.matmul(widen(a), widen(b), dtype=d.data.dtype) + d.data
    return _interp.TensorHandle(out, d.dtype.scalar)


def _patch_lang_tensor(tensor, scope):
    """_patch_lang_tensor: stock __index__ does int(ndarray), which numpy >= 2.4 refuses for the
    shape-(1,) arrays the interpreter uses as scalars (any `range(lo, hi)` on a computed bound fails
    with "only 0-dimensional arrays can be converted to Python scalars")."""
    _originals["_patch_lang_tensor"](tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))


# name -> (owner, replacement, parameters the replacement assumes the original has)
_PATCHES = {
    "_convert_float": (_interp, convert_float, ["input", "input_dtype", "output_dtype", "rounding_mode"]),
    "cast_impl": (_interp.InterpreterBuilder, _cast_impl, ["self", "src", "dst_type"]),
    "create_dot": (_interp.InterpreterBuilder, _create_dot,
                   ["self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"]),
    "_patch_lang_tensor": (_interp, _patch_lang_tensor, ["tensor", "scope"]),
}


def _fail(why):
    raise RuntimeError(f"triton_shim cannot patch triton {triton.__version__}'s interpreter: {why}. "
                       "Read triton/runtime/interpreter.py and update tests/triton_shim.py.")


def _check_internals():
    """Fail loudly if the internals this shim relies on moved, instead of silently not patching."""
    for name, (owner, _, params) in _PATCHES.items():
        original = getattr(owner, name, None)
        if original is None:
            _fail(f"{owner.__name__}.{name} is missing")
        got = list(inspect.signature(original).parameters)
        if got != params:
            _fail(f"{owner.__name__}.{name} takes {got}, expected {params}")
    for name in ("TensorHandle", "_get_np_dtype", "InterpreterBuilder"):
        if not hasattr(_interp, name):
            _fail(f"triton.runtime.interpreter.{name} is missing")
    # Casts reach the replacements only because these look them up by name at call time.
    builder = _interp.InterpreterBuilder
    for caller, callee in (("create_fp_to_fp", "_convert_float"), ("create_fp_trunc", "cast_impl"),
                           ("create_fp_ext", "cast_impl")):
        if callee not in getattr(builder, caller).__code__.co_names:
            _fail(f"InterpreterBuilder.{caller} no longer calls {callee}")
    if "_patch_lang_tensor" not in _interp._patch_lang.__code__.co_names:
        _fail("_patch_lang no longer calls _patch_lang_tensor")


def _self_check():
    """Run the builder entry points the kernels use on a few telling values."""
    builder = _interp.InterpreterBuilder()
    x = np.array([1.0625, 1.0 + 2.0**-4 + 2.0**-20, 500.0, -np.inf, 1.0 + 2.0**-8], dtype=np.float32)
    h = _interp.TensorHandle(x, tl.float32)
    fp8 = builder.create_fp_to_fp(h, tl.float8e4nv, _ir.ROUNDING_MODE.RTNE).data
    bf16 = builder.create_fp_trunc(h, tl.bfloat16).data
    want_fp8 = torch.clamp(torch.from_numpy(x), -448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    want_bf16 = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    ones = _interp.TensorHandle(np.full((2, 2), 0x3F80, np.uint16), tl.bfloat16)  # bf16 1.0
    acc = _interp.TensorHandle(np.zeros((2, 2), np.float32), tl.float32)
    dot = builder.create_dot(ones, ones, acc, None, None).data
    if not (np.array_equal(fp8, want_fp8) and np.array_equal(bf16, want_bf16) and np.all(dot == 2.0)):
        _fail(f"patched entry points still disagree with torch (fp8 {fp8} vs {want_fp8}, "
              f"bf16 {bf16} vs {want_bf16}, bf16 dot of ones {dot.ravel()})")


def install():
    """Patch triton's interpreter so that its float casts and tl.dot match the GPU. Idempotent."""
    if _originals:
        return
    _check_internals()
    for name, (owner, replacement, _) in _PATCHES.items():
        _originals[name] = getattr(owner, name)
        setattr(owner, name, replacement)
    try:
        _self_check()
    except BaseException:
        uninstall()
        raise


def uninstall():
    """Put the stock interpreter back (the tests use this to show what the shim fixes)."""
    for name, original in _originals.items():
        setattr(_PATCHES[name][0], name, original)
    _originals.clear()


def installed():
    return bool(_originals)
