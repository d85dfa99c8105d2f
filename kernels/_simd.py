"""Explicit 16-lane vectors inside Numba kernels.

Numba has no SIMD type, and LLVM vectorises a Numba loop only when it can prove that the
arrays in it do not overlap and the loop is long enough (a vector body of 64 elements and
more). Neither holds in a per-head product over 16-64 rows: LLVM cannot prove that ``out``
and ``b`` are different arrays, so ``out[i, j] += a[i, s] * b[s, j]`` stays scalar. Here a
vector is a value, like a float. It lives in a register, and the loop that updates it
stores nothing until the end:

    acc = vsplat(zero)                             # 16 zeros
    for s in range(n):
        acc = vfma(vsplat(a[i, s]), vload(b, off + s * row), acc)
    vstore(out, out_off, acc)

``vload(arr, k)`` and ``vstore(arr, k, v)`` read and write the 16 elements starting ``k``
elements after ``arr``'s first element, ignoring ``arr``'s strides. The caller computes ``k``
from the strides and makes sure the 16 elements are adjacent in memory (a row with unit last
stride) and inside the array: there is no bounds check. ``vfma(a, b, c)`` is a * b + c,
rounded once; ``vadd(a, b)`` is a + b.

A vector holds 16 elements of the array's dtype: one 512-bit register of float32 on an
AVX-512 CPU. LLVM splits it into two or four registers where they are narrower, and for
float64, so the kernels are correct on every x86-64 CPU and fastest where the registers
are widest.

Sums across lanes: ``vfold8``, ``vfold4``, ``vfold2``, ``vfold1`` halve the blocks of two
vectors and pack them into one (see :func:`_fold`); four rounds turn 16 vectors into one vector
of their 16 lane sums, each added in a tree whose order is fixed by the code (no ``reassoc``
can change it), so every machine gets the same bits.

Passing over what a loop does not need: ``vmax`` and ``vmax_lanes`` (sixteen running maxima,
reduced once), ``vmask_ge`` (a bit mask of the lanes not below a float64 threshold, compared
exactly) and ``lowest_bit`` (to visit those lanes in order): decoding's top log-softmax
(``bounded_top``) visits only the entries of a row that can still count.

A vector load is fastest from an address that starts a cache line: see
:mod:`npformer.aligned`, which allocates such arrays.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 16


class VectorType(types.Type):
    """The Numba type of LANES numbers of one float dtype, held in registers."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(name=f"vector{LANES}({dtype})")


@register_model(VectorType)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(element, LANES))


_vector_types = {}


def _vector_of(dtype):
    if dtype not in _vector_types:
        _vector_types[dtype] = VectorType(dtype)
    return _vector_types[dtype]


def _check_float(dtype, what):
    if dtype not in (types.float32, types.float64):
        raise TypeError(f"{what}: expected float32 or float64, got {dtype}")


def _vector_pointer(context, builder, array_type, array, offset):
    """Pointer to LANES elements starting ``offset`` elements after the array's first."""
    data = context.make_array(array_type)(context, builder, array).data
    element = builder.gep(data, [offset])
    return builder.bitcast(element, ir.VectorType(element.type.pointee, LANES).as_pointer())


@intrinsic
def vload(typingctx, array, offset):
    """array's elements offset .. offset + LANES - 1 (in memory order) as one vector."""
    _check_float(array.dtype, "vload")

    def codegen(context, builder, signature, args):
        pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load(pointer, align=array.dtype.bitwidth // 8)
    return _vector_of(array.dtype)(array, offset), codegen


@intrinsic
def vstore(typingctx, array, offset, vector):
    """Write the vector to array's elements offset .. offset + LANES - 1 (in memory order)."""
    _check_float(array.dtype, "vstore")
    if not isinstance(vector, VectorType) or vector.dtype != array.dtype:
        raise TypeError(f"vstore: expected a vector of {array.dtype}, got {vector}")

    def codegen(context, builder, signature, args):
        pointer = _vector_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], pointer, align=array.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.none(array, offset, vector), codegen


@intrinsic
def vsplat(typingctx, x):
    """A vector with every lane equal to the float x."""
    _check_float(x, "vsplat")

    def codegen(context, builder, signature, args):
        vector_type = ir.VectorType(args[0].type, LANES)
        one_lane = builder.insert_element(ir.Constant(vector_type, ir.Undefined), args[0],
                                          ir.Constant(ir.IntType(32), 0))
        every_lane_from_0 = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        return builder.shuffle_vector(one_lane, ir.Constant(vector_type, ir.Undefined),
                                      every_lane_from_0)
    return _vector_of(x)(x), codegen


@intrinsic
def vadd(typingctx, a, b):
    """a + b lane by lane."""
    if not (isinstance(a, VectorType) and a == b):
        raise TypeError(f"vadd: expected two vectors of one dtype, got {a}, {b}")

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])
    return a(a, b), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c lane by lane, rounded once (LLVM's fma intrinsic)."""
    if not (isinstance(a, VectorType) and a == b == c):
        raise TypeError(f"vfma: expected three vectors of one dtype, got {a}, {b}, {c}")

    def codegen(context, builder, signature, args):
        vector_type = args[0].type
        suffix = "f32" if a.dtype == types.float32 else "f64"
        fma = cgutils.get_or_insert_function(builder.module,
                                             ir.FunctionType(vector_type, [vector_type] * 3),
                                             f"llvm.fma.v{LANES}{suffix}")
        return builder.call(fma, args)
    return a(a, b, c), codegen


@intrinsic
def vmax(typingctx, a, b):
    """The larger of a and b lane by lane (b where a lane compares false: a NaN in a gives b)."""
    if not (isinstance(a, VectorType) and a == b):
        raise TypeError(f"vmax: expected two vectors of one dtype, got {a}, {b}")

    def codegen(context, builder, signature, args):
        return builder.select(builder.fcmp_ordered(">", args[0], args[1]), args[0], args[1])
    return a(a, b), codegen



@intrinsic
def vmask_ge(typingctx, v, x):
    """A bit mask of the lanes of v not below the float64 x: bit i set where v[i] >= x, compared
    exactly (a float32 vector is widened to float64 first; a NaN lane is never set). One
    comparison, no reduction: a loop passes over a vector none of whose lanes it needs on one
    integer test."""
    if not isinstance(v, VectorType) or x != types.float64:
        raise TypeError(f"vmask_ge: expected a vector and a float64, got {v}, {x}")

    def codegen(context, builder, signature, args):
        wide = ir.VectorType(ir.DoubleType(), LANES)
        lanes = args[0] if v.dtype == types.float64 else builder.fpext(args[0], wide)
        splat = builder.insert_element(ir.Constant(wide, ir.Undefined), args[1],
                                       ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(splat, ir.Constant(wide, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), LANES),
                                                   [0] * LANES))
        bits = builder.bitcast(builder.fcmp_ordered(">=", lanes, splat), ir.IntType(LANES))
        return builder.zext(bits, ir.IntType(64))
    return types.int64(v, x), codegen


@intrinsic
def lowest_bit(typingctx, mask):
    """The index of the lowest set bit of the int64 ``mask`` (64 where none is set): with
    ``mask &= mask - 1`` a loop visits exactly the lanes :func:`vmask_ge` set, in order."""
    if mask != types.int64:
        raise TypeError(f"lowest_bit: expected an int64, got {mask}")

    def codegen(context, builder, signature, args):
        cttz = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(1)]),
            "llvm.cttz.i64")
        return builder.call(cttz, [args[0], ir.Constant(ir.IntType(1), 0)])
    return types.int64(mask), codegen


@intrinsic
def vmax_lanes(typingctx, v):
    """The largest of v's lanes (LLVM's vector max reduction; NaN lanes are passed over)."""
    if not isinstance(v, VectorType):
        raise TypeError(f"vmax_lanes: expected a vector, got {v}")

    def codegen(context, builder, signature, args):
        vector_type = args[0].type
        suffix = "f32" if v.dtype == types.float32 else "f64"
        reduce = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector_type.element, [vector_type]),
            f"llvm.vector.reduce.fmax.v{LANES}{suffix}")
        return builder.call(reduce, args)
    return v.dtype(v), codegen


def _fold(h):
    """The intrinsic ``vfold<h>(a, b)``, h in 8, 4, 2, 1: the lanes in blocks of 2h; in each
    block, the result's first h lanes are a's block halved (a[s + i] + a[s + h + i]) and its last
    h lanes b's (b[s + h + i] + b[s + i]). From 16 vectors x_0 .. x_15: ``vfold8`` on the pairs,
    then ``vfold4``, ``vfold2``, ``vfold1`` on the results' pairs leave one vector whose lane l
    holds the sum of the 16 lanes of x_r, r = l's four bits reversed (0, 8, 4, 12, 2, ...): feed
    the vectors in that order and lane l holds the sum of the l-th."""
    lo, hi = [], []
    for lane in range(LANES):
        start, i = lane - lane % (2 * h), lane % (2 * h)
        if i < h:                                     # a's block: its halves (b's lanes: +16)
            lo.append(start + i)
            hi.append(start + h + i)
        else:
            lo.append(LANES + start + i)
            hi.append(LANES + start + i - h)

    def vfold(typingctx, a, b):
        if not (isinstance(a, VectorType) and a == b):
            raise TypeError(f"vfold{h}: expected two vectors of one dtype, got {a}, {b}")

        def codegen(context, builder, signature, args):
            def pick(lanes):
                mask = ir.Constant(ir.VectorType(ir.IntType(32), LANES), lanes)
                return builder.shuffle_vector(args[0], args[1], mask)
            return builder.fadd(pick(lo), pick(hi))
        return a(a, b), codegen
    vfold.__name__ = vfold.__qualname__ = f"vfold{h}"
    return intrinsic(vfold)


vfold8, vfold4, vfold2, vfold1 = _fold(8), _fold(4), _fold(2), _fold(1)


@intrinsic
def prefetch(typingctx, array, offset):
    """Ask the CPU to bring the cache line holding array's element ``offset`` (in memory order,
    as :func:`vload`) into its caches, without waiting for it: a hint (LLVM's ``prefetch``, for
    reading, kept in every level), which never faults, whatever the address."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        pointer = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [pointer.type] + [ir.IntType(32)] * 3),
            "llvm.prefetch.p0i8")
        i32 = ir.IntType(32)
        builder.call(hint, [pointer, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.none(array, offset), codegen
