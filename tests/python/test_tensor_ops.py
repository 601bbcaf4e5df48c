"""Data movement ops (include/dsv4/tensor_ops.h) against numpy: embedding rows with their copies,
the broadcast BF16 add (float64 sum of the two BF16 values, rounded to fp32 then to BF16 by
ml_dtypes: exact, since f64 -> f32 double rounding of a sum of two floats is innocuous), plain
and gathered row copies. Fresh random inputs each run (seed printed), outputs poisoned first,
every cpu path; bad input raises and leaves the output untouched."""
import numpy as np
import pytest

import dsv4
import oracles as o


def random_bf16(rng, shape):
    """Any bit pattern: normal, subnormal, zeros of both signs, infinities, NaNs."""
    return rng.integers(0, 2**16, shape, dtype=np.uint64).astype(np.uint16)


def strided_rows(rng, rows, cols, pad=3):
    """A BF16 [rows, cols] view with a row stride longer than its rows (a slice of a wider array)."""
    return random_bf16(rng, (rows, cols + pad))[:, 1:1 + cols]


# ---- embed_rows --------------------------------------------------------------------------
@pytest.mark.parametrize("T,V,D,copies", [(1, 7, 4096, 4), (9, 50, 37, None), (6, 3, 16, 1), (0, 5, 8, 4)])
def test_embed_rows(backend, T, V, D, copies, request):
    rng = o.rng(request.node.name)
    table = strided_rows(rng, V, D)
    ids = rng.integers(0, V, T).astype(np.int32)
    y = dsv4.embed_rows(table, ids, copies, backend=backend)
    want = table[ids] if copies is None else np.repeat(table[ids][:, None, :], copies, axis=1)
    assert y.shape == want.shape and np.array_equal(y, want)


def test_embed_rows_strided_ids_and_out(backend, request):
    rng = o.rng(request.node.name)
    table = random_bf16(rng, (11, 40))
    ids = rng.integers(0, 11, 10).astype(np.int32)[::2]  # stride 2
    out = o.poison((5, 6, 48), np.uint16)[:, 1:5, 3:43]  # strided copies and rows
    dsv4.embed_rows(table, ids, 4, backend=backend, out=out)
    assert np.array_equal(out, np.repeat(table[ids][:, None, :], 4, axis=1))


def test_embed_rows_bad_input(request):
    rng = o.rng(request.node.name)
    V, D = 6, 32
    table = random_bf16(rng, (V, D))
    ids = rng.integers(0, V, 4).astype(np.int32)
    y = o.poison((4, 2, D), np.uint16)

    def expect(**kw):
        args = dict(table=table, ids=ids, copies=2, out=y) | kw
        snap = y.copy()
        with pytest.raises(ValueError):
            dsv4.embed_rows(**args)
        assert np.array_equal(y, snap), "output written on error"

    for bad_id in (V, -1, 2**31 - 1):
        bad = ids.copy()
        bad[2] = bad_id
        expect(ids=bad)
    expect(ids=ids[:3])  # T mismatch with out
    expect(table=table[:, :16])  # D mismatch
    expect(ids=ids.astype(np.int64))  # wrong dtype
    expect(out=y[:, :, ::2])  # non-unit inner stride
    with pytest.raises(ValueError):  # out inside the table
        dsv4.embed_rows(table, ids[:2], None, out=table[3:5])
    with pytest.raises(ValueError):  # a broadcast output
        dsv4.embed_rows(table, ids, 2, out=np.broadcast_to(np.zeros(D, np.uint16), (4, 2, D)))


# ---- add_bf16 ----------------------------------------------------------------------------
def add_oracle(a, b):
    """bf16(f32(a) + f32(b)) with b broadcast over the copies."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN inputs, inf - inf
        a64 = o.bf16_decode(a)
        b64 = o.bf16_decode(b)
        if a.ndim == 3:
            b64 = b64[:, None, :]
        return o.bf16_encode((a64 + b64).astype(np.float32))


def assert_add_equal(y, want):
    """Bit-identical, NaN aside: a NaN is the canonical quiet NaN 0x7FC0 with either sign."""
    yn = (y & 0x7FFF) > 0x7F80
    wn = (want & 0x7FFF) > 0x7F80
    assert np.array_equal(yn, wn), "NaN positions differ"
    assert np.all((y[yn] & 0x7FFF) == 0x7FC0), "a NaN that is not the canonical quiet NaN"
    assert np.array_equal(y[~yn], want[~yn]), f"{np.sum(y[~yn] != want[~yn])} values differ"


@pytest.mark.parametrize("T,n,D", [(3, 4, 4096 + 5), (5, None, 37), (1, 1, 16), (2, 4, 7)])
def test_add_bf16(backend, T, n, D, request):
    rng = o.rng(request.node.name)
    a = random_bf16(rng, (T, D) if n is None else (T, n, D))
    b = random_bf16(rng, (T, D))
    want = add_oracle(a, b)
    assert_add_equal(dsv4.add_bf16(a, b, backend=backend), want)
    # finite values of moderate range too (random bits are mostly huge or tiny)
    a2 = o.bf16_encode(rng.standard_normal(a.shape).astype(np.float32))
    b2 = o.bf16_encode(rng.standard_normal(b.shape).astype(np.float32))
    assert_add_equal(dsv4.add_bf16(a2, b2, backend=backend), add_oracle(a2, b2))
    inplace = a2.copy()
    dsv4.add_bf16(inplace, b2, backend=backend, out=inplace)
    assert_add_equal(inplace, add_oracle(a2, b2))


def test_add_bf16_specials(backend):
    """Every pair of special values; a NaN result takes a's sign when a is NaN, else b's."""
    vals = np.array([0x7FC1, 0xFFC3, 0x7F81, 0xFF85, 0x7F80, 0xFF80, 0x3F80, 0xBF80, 0x8000, 0x0000, 0x0001,
                     0x8001, 0x7F7F, 0xFF7F], np.uint16)
    A, B = np.meshgrid(vals, vals)
    a, b = A.reshape(1, 1, -1), B.reshape(1, -1)
    y = dsv4.add_bf16(a, b, backend=backend)[0, 0]
    a, b = a[0, 0], b[0]
    an, bn = (a & 0x7FFF) > 0x7F80, (b & 0x7FFF) > 0x7F80
    assert np.array_equal(y[an], (a[an] & 0x8000) | 0x7FC0)
    assert np.array_equal(y[~an & bn], (b[~an & bn] & 0x8000) | 0x7FC0)
    rest = ~an & ~bn
    assert_add_equal(y[rest], add_oracle(a[rest][None, :], b[rest][None, :])[0])


def test_add_bf16_strided(backend, request):
    rng = o.rng(request.node.name)
    big = random_bf16(rng, (4, 6, 50))
    a = big[:, 1:5, 2:42]
    b = random_bf16(rng, (4, 45))[:, :40]
    out = o.poison((4, 5, 41), np.uint16)[:, :4, 1:]
    dsv4.add_bf16(a, b, backend=backend, out=out)
    assert_add_equal(out, add_oracle(a, b))


def test_add_bf16_bad_input(request):
    rng = o.rng(request.node.name)
    a = random_bf16(rng, (3, 4, 32))
    b = random_bf16(rng, (3, 32))
    y = o.poison(a.shape, np.uint16)

    def expect(**kw):
        args = dict(a=a, b=b, out=y) | kw
        snap = y.copy()
        with pytest.raises(ValueError):
            dsv4.add_bf16(**args)
        assert np.array_equal(y, snap), "output written on error"

    expect(b=b[:2])
    expect(b=random_bf16(rng, (3, 16)))
    expect(a=a[:, :, :16])
    expect(a=a[:, 0, :])  # 2-D a, 3-D y
    expect(b=b.astype(np.float32))
    work = a.copy()
    with pytest.raises(ValueError):  # y overlapping a without being a
        dsv4.add_bf16(work[:, :3], b, out=work[:, 1:])
    with pytest.raises(ValueError):  # y overlapping b
        dsv4.add_bf16(work[:, 0, :], work[:, 0, :], out=work[:, 0, :])


# ---- copy_rows ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.uint8, np.int64])
@pytest.mark.parametrize("gather", [False, True])
def test_copy_rows(backend, dtype, gather, request):
    rng = o.rng(request.node.name)
    R, C = 13, 301
    src = rng.integers(0, 200, (R, C + 5)).astype(dtype)[:, 2:2 + C]  # strided rows
    idx = rng.integers(0, R, 20).astype(np.int32) if gather else None
    y = dsv4.copy_rows(src, idx, backend=backend)
    assert np.array_equal(y, src[idx] if gather else src)
    out = o.poison((y.shape[0], C + 7), dtype)[:, 3:3 + C]
    dsv4.copy_rows(src, idx[::2] if gather else None, backend=backend, out=out[: (10 if gather else R)])
    assert np.array_equal(out[: (10 if gather else R)], src[idx[::2]] if gather else src)


def test_copy_rows_same_view_is_a_no_op(backend):
    x = np.arange(40, dtype=np.float32).reshape(4, 10)
    snap = x.copy()
    dsv4.copy_rows(x, None, backend=backend, out=x)
    assert np.array_equal(x, snap)


def test_copy_rows_bad_input(request):
    rng = o.rng(request.node.name)
    src = rng.standard_normal((5, 8)).astype(np.float32)
    idx = np.array([4, 0, 2], np.int32)
    y = o.poison((3, 8), np.float32)

    def expect(**kw):
        args = dict(src=src, idx=idx, out=y) | kw
        snap = y.copy()
        with pytest.raises(ValueError):
            dsv4.copy_rows(**args)
        assert np.array_equal(y, snap, equal_nan=True), "output written on error"

    expect(idx=np.array([4, 5, 2], np.int32))
    expect(idx=np.array([0, -1, 2], np.int32))
    expect(idx=idx[:2])
    expect(src=src[:, :4])
    expect(idx=None)  # 5 rows into 3
    expect(out=y.astype(np.float64).view(np.int64))  # another dtype
    buf = rng.standard_normal((6, 8)).astype(np.float32)
    with pytest.raises(ValueError):  # a gather into its own source
        dsv4.copy_rows(buf[:3], np.array([2, 1, 0], np.int32), out=buf[:3])
    with pytest.raises(ValueError):  # overlapping, not the same view
        dsv4.copy_rows(buf[:3], None, out=buf[1:4])


def test_threads(request):
    rng = o.rng(request.node.name)
    table = random_bf16(rng, (64, 4096))
    ids = rng.integers(0, 64, 33).astype(np.int32)
    a = random_bf16(rng, (33, 4, 4096))
    for t in (1, 2):
        assert np.array_equal(dsv4.embed_rows(table, ids, 4, backend="cpu", threads=t),
                              dsv4.embed_rows(table, ids, 4, backend="cpu-ref"))
        assert np.array_equal(dsv4.add_bf16(a, table[ids], backend="cpu", threads=t),
                              dsv4.add_bf16(a, table[ids], backend="cpu-ref"))
        assert np.array_equal(dsv4.copy_rows(table, ids, backend="cpu", threads=t), table[ids])
