"""RMSNorm, mHC and the router against float64 numpy oracles written from the docs
(docs/model.md §3 RMSNorm, §4 mHC, §7.1 router; docs/kernels.md §7), not from the C code.

Every test draws fresh random inputs (seed printed; DSV4_TEST_SEED replays), poisons the outputs
first, and runs on the scalar reference (cpu-ref) and on every path of the cpu backend
(DSV4_CPU_ISA caps the ISA). Tolerances are stated where they are used."""
import numpy as np
import pytest

import dsv4
import oracles as o


def bf16_randn(rng, shape, scale=1.0):
    return o.bf16_encode((rng.standard_normal(shape) * scale).astype(np.float32))


def f32_randn(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def assert_bf16_close(got, ref, terms, what):
    """got (BF16 bits) vs the float64 value ref. The kernel computes ref in fp32 (error <= 2e-6 of
    `terms`, the sum of |terms| of the expression, for these short or fp32-accumulated sums),
    then rounds once to BF16 (at most half an ulp, <= 2^-8 |value|). So
    |got - ref| <= 2^-8 |ref| + 2e-5 * terms leaves a 10x margin on the fp32 part."""
    g = o.bf16_decode(got)
    tol = 2.0**-8 * np.abs(ref) + 2e-5 * terms + 1e-30
    bad = np.abs(g - ref) > tol
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, worst {np.max(np.abs(g - ref) - tol)}"


def assert_within(got, ref, atol, what):
    """|got - ref| <= atol elementwise (atol broadcast), NaN (a poisoned output) failing."""
    err = np.abs(np.asarray(got, np.float64) - ref)
    bad = ~(err <= atol)
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, worst {np.max(err / atol):.3g}x the bound"


# ---- RMSNorm ---------------------------------------------------------------------------
def rms_oracle(x, w, eps):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w


@pytest.mark.parametrize("rows,d", [(1, 4096), (5, 1000), (3, 7), (2, 64)])
@pytest.mark.parametrize("wtype", ["bf16", "f32", None])
def test_rms_norm_weighted_and_unweighted(backend, rows, d, wtype, request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (rows, d), 3.0)
    w = None if wtype is None else f32_randn(rng, d) + 1.0
    if wtype == "bf16":
        w = o.bf16_encode(w)
    y = o.poison((rows, d), np.uint16)
    dsv4.rms_norm(x, w, 1e-6, backend=backend, out=y)
    w64 = None if w is None else (o.bf16_decode(w) if wtype == "bf16" else w.astype(np.float64))
    ref = rms_oracle(o.bf16_decode(x), w64, 1e-6)
    assert_bf16_close(y, ref, np.abs(ref), "rms_norm")


def test_rms_norm_f32_in_out_and_per_head(backend, request):
    """F32 in / F32 out: only fp32 rounding. The sum of d squares (positive terms, any order) is
    within (d-1) 2^-24 of itself, / d and + eps add 2^-24 each, the square root halves the
    relative error and adds half an ulp, then the reciprocal and the product one ulp each:
    relative error <= (d/2 + 4) 2^-24 (52 ulps, 3.1e-6 for d = 96), a worst case, never a
    typical one: measured at most 5.7 ulps (3.4e-7) over 100 runs x 4 paths (~9x margin).
    Per-head form: q [T, H, hd] unweighted, each head normalized by itself."""
    rng = o.rng(request.node.name)
    d = 96
    x = f32_randn(rng, (3, 4, d), 0.01)  # small values: eps must not dominate (mean x^2 = 1e-4)
    y = o.poison(x.shape, np.float32)
    dsv4.rms_norm(x, None, 1e-6, out_dtype="f32", backend=backend, out=y)
    ref = rms_oracle(x.astype(np.float64), None, 1e-6)
    np.testing.assert_allclose(y, ref, rtol=(d / 2 + 4) * 2.0**-24, atol=0)
    q = bf16_randn(rng, (2, 8, 64))
    yq = dsv4.rms_norm(q, None, 1e-6, backend=backend)
    assert_bf16_close(yq, rms_oracle(o.bf16_decode(q), None, 1e-6), 1.0, "per-head")


def test_rms_norm_in_place(backend, request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (4, 300))
    w = o.bf16_encode(f32_randn(rng, 300) + 1)
    want = dsv4.rms_norm(x, w, 1e-6, backend=backend)
    dsv4.rms_norm(x, w, 1e-6, backend=backend, out=x)
    assert np.array_equal(x, want)


# ---- mHC -------------------------------------------------------------------------------
def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def sinkhorn(c, iters, eps):
    c = np.exp(c - c.max(-1, keepdims=True))
    c = c / c.sum(-1, keepdims=True) + eps
    c = c / (c.sum(-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdims=True) + eps)
        c = c / (c.sum(-2, keepdims=True) + eps)
    return c


def hc_pre_oracle(x, fn, scale, base, iters=20, eps=1e-6, norm_eps=1e-6, head=False):
    """docs/model.md §4.1 / §4.4 in float64. x [T, n, D] values."""
    T, n, D = x.shape
    xf = x.reshape(T, n * D)
    r = 1.0 / np.sqrt((xf * xf).mean(-1) + norm_eps)
    mix = (xf @ fn.astype(np.float64).T) * r[:, None]
    scale = scale.astype(np.float64)
    base = base.astype(np.float64)
    pre = sigmoid(mix[:, :n] * scale[0] + base[:n]) + eps
    y = (pre[:, :, None] * x).sum(1)
    terms = (pre[:, :, None] * np.abs(x)).sum(1)
    if head:
        return y, terms
    post = 2.0 * sigmoid(mix[:, n:2 * n] * scale[1] + base[n:2 * n])
    comb = sinkhorn((mix[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(T, n, n), iters, eps)
    return y, terms, post, comb


def hc_site(rng, n, D, head=False):
    """fn scaled so the mixes are O(1) (comb logits of std ~1: Sinkhorn converges to ~1e-3)."""
    nmix = n if head else (2 + n) * n
    fn = f32_randn(rng, (nmix, n * D), 1.0 / np.sqrt(n * D))
    scale = rng.uniform(0.5, 1.5, 1 if head else 3).astype(np.float32)
    base = f32_randn(rng, nmix, 0.5)
    return fn, scale, base


def post_oracle(x, res, post, comb):
    new = post[:, :, None] * x[:, None, :] + np.einsum("tjk,tjd->tkd", comb, res)
    terms = np.abs(post)[:, :, None] * np.abs(x)[:, None, :] + np.einsum("tjk,tjd->tkd", np.abs(comb), np.abs(res))
    return new, terms


def hc_atol(x, fn, norm_eps=1e-6):
    """Absolute tolerance [T, 1] of post and comb (broadcast with [..., None] for comb [T, n, n]).

    post = 2 sigmoid(s1 mix + b) and comb = Sinkhorn(s2 mix + b) are fp32 functions of the fp32
    mixes mix_j = r sum_k x_k fn_jk (n*D-term dot products, r = 1/rms(x)). Such a sum's fp32
    error is a few ulps of M_j = r sum_k |x_k fn_jk| (a random walk, see test_linear.py) whatever
    n*D; post's slope in a mix is 2 sigmoid' s1 <= 0.75 and Sinkhorn's normalizations contract.
    So: 4 ulps of the token's largest M_j, plus 16 ulps for the fp32 sigmoid/exp/normalizations
    of these O(1) values. Measured: at most 0.78 ulp of max M (post; comb 0.30) over 60 seeds x
    4 paths x the shapes below (worst 2.8e-6 at D = 4096, M ~ 84, against a bound of 2.1e-5 there;
    1.5e-6 at D = 16): margins of >= 7x. (A flat 2e-5 was 100x looser than needed for small D.)"""
    T, n, D = x.shape
    xf = x.reshape(T, n * D)
    r = 1.0 / np.sqrt((xf * xf).mean(-1) + norm_eps)
    m = (np.abs(xf) @ np.abs(fn.astype(np.float64)).T).max(-1) * r
    return (4.0 * m + 16.0)[:, None] * 2.0**-24


@pytest.mark.parametrize("T,n,D", [(1, 4, 4096), (3, 4, 200), (6, 4, 64), (2, 2, 37), (5, 1, 16)])
def test_hc_pre(backend, T, n, D, request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (T, n, D), 2.0)
    fn, scale, base = hc_site(rng, n, D)
    out = (o.poison((T, D), np.uint16), o.poison((T, n), np.float32), o.poison((T, n, n), np.float32))
    y, post, comb = dsv4.hc_pre(x, fn, scale, base, 20, 1e-6, 1e-6, backend=backend, out=out)
    ry, terms, rpost, rcomb = hc_pre_oracle(o.bf16_decode(x), fn, scale, base)
    assert_bf16_close(y, ry, terms, "hc_pre y")
    atol = hc_atol(o.bf16_decode(x), fn)
    assert_within(post, rpost, atol, "hc_pre post")
    assert_within(comb, rcomb, atol[..., None], "hc_pre comb")
    # Sinkhorn property: after the final column step every column sums to S/(S+eps) = 1 - ~1e-6
    # (plus fp32 rounding of 4-8 terms). Rows only converge: over 10^4 random 4x4 logit matrices
    # of std 2 (ours are <= ~1.7) 20 iterations left row sums within 0.032 of 1.
    assert np.abs(comb.sum(-2) - 1).max() < 3e-6
    assert np.abs(comb.sum(-1) - 1).max() < 0.05
    assert (post > 0).all() and (post < 2).all() and (comb > 0).all()


def test_hc_pre_iterations_and_eps(backend, request):
    """Non-default iteration count and epsilons reach the kernel (1 iteration = softmax + one
    column normalization; eps 1e-3 as in the XPU tests of docs/kernels.md §10, item 6)."""
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (2, 4, 48))
    fn, scale, base = hc_site(rng, 4, 48)
    for iters, eps in [(1, 1e-6), (3, 1e-3)]:
        y, post, comb = dsv4.hc_pre(x, fn, scale, base, iters, eps, 1e-3, backend=backend)
        ry, terms, rpost, rcomb = hc_pre_oracle(o.bf16_decode(x), fn, scale, base, iters, eps, 1e-3)
        assert_bf16_close(y, ry, terms, f"hc_pre y iters={iters}")
        atol = hc_atol(o.bf16_decode(x), fn, 1e-3)
        assert_within(post, rpost, atol, f"hc_pre post iters={iters}")
        assert_within(comb, rcomb, atol[..., None], f"hc_pre comb iters={iters}")


@pytest.mark.parametrize("T,n,D", [(1, 4, 4096), (4, 4, 100), (3, 3, 17)])
def test_hc_post(backend, T, n, D, request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (T, D), 3.0)
    res = bf16_randn(rng, (T, n, D), 2.0)
    post = rng.uniform(0, 2, (T, n)).astype(np.float32)
    comb = rng.uniform(0, 1, (T, n, n)).astype(np.float32)
    out = o.poison((T, n, D), np.uint16)
    dsv4.hc_post(x, res, post, comb, backend=backend, out=out)
    ref, terms = post_oracle(o.bf16_decode(x), o.bf16_decode(res), post.astype(np.float64), comb.astype(np.float64))
    assert_bf16_close(out, ref, terms, "hc_post")
    # designed bit-identical on every path (products and sums in the scalar order, no FMA)
    assert np.array_equal(out, dsv4.hc_post(x, res, post, comb, backend="cpu-ref"))
    # in place: out is the residual itself
    res2 = res.copy()
    dsv4.hc_post(x, res2, post, comb, backend=backend, out=res2)
    assert np.array_equal(res2, out)


def test_hc_post_pre_equals_two_calls(backend, request):
    """The fused op is hc_post then hc_pre exactly (same backend: bit for bit), also in place."""
    rng = o.rng(request.node.name)
    T, n, D = 5, 4, 160
    x = bf16_randn(rng, (T, D))
    res = bf16_randn(rng, (T, n, D))
    _, post, comb = dsv4.hc_pre(res, *hc_site(rng, n, D), backend=backend)
    fn, scale, base = hc_site(rng, n, D)
    out = (o.poison((T, n, D), np.uint16), o.poison((T, D), np.uint16), o.poison((T, n), np.float32),
           o.poison((T, n, n), np.float32))
    s, y, p2, c2 = dsv4.hc_post_pre(x, res, post, comb, fn, scale, base, backend=backend, out=out)
    s_ref = dsv4.hc_post(x, res, post, comb, backend=backend)
    y_ref, p_ref, c_ref = dsv4.hc_pre(s_ref, fn, scale, base, backend=backend)
    for a, b in [(s, s_ref), (y, y_ref), (p2, p_ref), (c2, c_ref)]:
        assert np.array_equal(a, b)
    # against the oracle too: streams BF16-rounded between the two steps (docs/model.md §4.3)
    ry, terms, rpost, rcomb = hc_pre_oracle(o.bf16_decode(s_ref), fn, scale, base)
    assert_bf16_close(y, ry, terms, "fused y")
    atol = hc_atol(o.bf16_decode(s_ref), fn)
    assert_within(p2, rpost, atol, "fused post")
    assert_within(c2, rcomb, atol[..., None], "fused comb")
    # in place: streams = residual, post' = post, comb' = comb
    r2, p3, c3 = res.copy(), post.copy(), comb.copy()
    y3 = o.poison((T, D), np.uint16)
    dsv4.hc_post_pre(x, r2, p3, c3, fn, scale, base, backend=backend, out=(r2, y3, p3, c3))
    for a, b in [(r2, s), (y3, y), (p3, p2), (c3, c2)]:
        assert np.array_equal(a, b)


@pytest.mark.parametrize("T,n,D", [(1, 4, 4096), (3, 4, 50)])
def test_hc_head(backend, T, n, D, request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (T, n, D))
    fn, scale, base = hc_site(rng, n, D, head=True)
    y = o.poison((T, D), np.uint16)
    dsv4.hc_head(x, fn, scale, base, backend=backend, out=y)
    ry, terms = hc_pre_oracle(o.bf16_decode(x), fn, scale, base, head=True)
    assert_bf16_close(y, ry, terms, "hc_head")


def test_mhc_threads_and_batch_independence(request):
    """1 vs 2 threads bit for bit; a token's outputs do not depend on the rest of the batch."""
    rng = o.rng(request.node.name)
    T, n, D = 7, 4, 300
    x = bf16_randn(rng, (T, n, D))
    site = hc_site(rng, n, D)
    one = dsv4.hc_pre(x, *site, backend="cpu", threads=1)
    two = dsv4.hc_pre(x, *site, backend="cpu", threads=2)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)
    single = dsv4.hc_pre(x[5:6], *site, backend="cpu", threads=2)
    for a, b in zip(one, single):
        assert np.array_equal(a[5:6], b)


# ---- router ----------------------------------------------------------------------------
def softplus(z):
    return np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20))))


def router_oracle(x, w, bias):
    score = np.sqrt(softplus(x @ w.T))
    return score, score + (0 if bias is None else bias.astype(np.float64))


# Router keys are fp32 functions of D-term fp32 dot products (abs. error ~1e-6 for these
# sizes): two experts whose float64 keys are closer than KEY_TOL may legally come out in either
# order; everything else must match the float64 ranking exactly.
KEY_TOL = 1e-4


def check_selection(ids, key, topk):
    T = key.shape[0]
    order = np.argsort(-key, axis=1, kind="stable")[:, :topk]  # ties: lower index first
    for t in range(T):
        sel = ids[t]
        assert len(set(sel.tolist())) == topk
        ks = key[t, sel]
        assert (ks[:-1] >= ks[1:] - KEY_TOL).all(), f"token {t}: not descending"
        rest = np.delete(key[t], sel)
        if rest.size:
            assert ks.min() >= rest.max() - KEY_TOL, f"token {t}: a better expert was left out"
        srt = np.sort(key[t])[::-1]
        if np.all(np.abs(np.diff(srt[:topk + 1])) > KEY_TOL):
            assert np.array_equal(sel, order[t]), f"token {t}: {sel} vs reference {order[t]}"


def check_weights(ids, weights, score, route_scale):
    """weights: fp32 ratios of fp32 scores, relative error within 96 ulps (5.7e-6). A score
    sqrt(softplus(z)) carries half the absolute error of its dot product z (softplus' <= softplus
    for every z, the square root halves), a few ulps of sum|x w| (<= 35 here) by the random-walk
    argument of test_linear.py, plus the fp32 softplus/sqrt/ratio roundings. Measured: at most
    19 ulps (1.13e-6) over 100 runs x 4 paths and 60 seeds x 4 paths x every case (~5x margin;
    the former 1e-5 was 8.8x)."""
    s = np.take_along_axis(score, ids.astype(np.int64), axis=1)
    np.testing.assert_allclose(weights, s / s.sum(1, keepdims=True) * route_scale, rtol=96 * 2.0**-24, atol=0)


@pytest.mark.parametrize("T,E,D,topk", [(1, 256, 512, 6), (9, 64, 100, 6), (4, 16, 33, 1), (3, 8, 64, 8)])
@pytest.mark.parametrize("wtype", ["bf16", "f32"])
def test_route_biased_topk(backend, T, E, D, topk, wtype, request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (T, D))
    w = f32_randn(rng, (E, D), 2.0 / np.sqrt(D))
    if wtype == "bf16":
        w = o.bf16_encode(w)
    bias = f32_randn(rng, E, 0.1)
    out = (o.poison((T, topk), np.int32), o.poison((T, topk), np.float32))
    ids, weights = dsv4.route(x, w, bias, topk, 1.5, backend=backend, out=out)
    w64 = o.bf16_decode(w) if wtype == "bf16" else w.astype(np.float64)
    score, key = router_oracle(o.bf16_decode(x), w64, bias)
    check_selection(ids, key, topk)
    check_weights(ids, weights, score, 1.5)


def test_route_f32_input_and_no_bias(backend, request):
    rng = o.rng(request.node.name)
    x = f32_randn(rng, (5, 96))
    w = f32_randn(rng, (32, 96), 0.3)
    ids, weights = dsv4.route(x, w, None, 4, 2.5, backend=backend)
    score, key = router_oracle(x.astype(np.float64), w.astype(np.float64), None)
    check_selection(ids, key, 4)
    check_weights(ids, weights, score, 2.5)


def test_route_ties_and_equal_scores(backend):
    """All experts score the same: the tie-break takes the lower index first; with a bias that
    ties a subset, that subset in index order. The weights are then all route_scale/topk."""
    E, D, k = 16, 64, 6
    x = o.bf16_encode(np.linspace(-1, 1, 2 * D).reshape(2, D).astype(np.float32))
    w = np.tile(o.bf16_encode(np.full(D, 0.01, np.float32)), (E, 1))
    ids, weights = dsv4.route(x, w, None, k, 1.5, backend=backend)
    assert (ids == np.arange(k)).all()
    np.testing.assert_allclose(weights, 1.5 / k, rtol=1e-6)
    bias = np.tile(np.float32([0.0, 1.0]), E // 2)
    ids, weights = dsv4.route(x, w, bias, k, 1.5, backend=backend)
    assert (ids == np.arange(1, 2 * k, 2)).all()
    np.testing.assert_allclose(weights, 1.5 / k, rtol=1e-6)


def test_route_large_logits_softplus_threshold(backend, request):
    """Logits beyond 20 take softplus(z) = z; scores stay finite and ordered."""
    rng = o.rng(request.node.name)
    D, E = 32, 12
    x = o.bf16_encode(np.full((1, D), 1.0, np.float32))
    w = o.bf16_encode((rng.uniform(-2, 2, (E, 1)) * np.ones((1, D))).astype(np.float32))  # logits in (-64, 64)
    ids, weights = dsv4.route(x, w, None, 3, 1.0, backend=backend)
    score, key = router_oracle(o.bf16_decode(x), o.bf16_decode(w), None)
    check_selection(ids, key, 3)
    check_weights(ids, weights, score, 1.0)


@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_route_hash_layers(backend, itype, request):
    rng = o.rng(request.node.name)
    T, E, D, V, k = 7, 32, 80, 50, 6
    x = bf16_randn(rng, (T, D))
    w = bf16_randn(rng, (E, D), 0.2)
    table = np.stack([rng.permutation(E)[:k] for _ in range(V)]).astype(itype)
    tok = rng.integers(0, V, T).astype(itype)
    ids, weights = dsv4.route(x, w, None, k, 1.5, tid2eid=table, token_ids=tok, backend=backend)
    assert np.array_equal(ids, table[tok])
    score, _ = router_oracle(o.bf16_decode(x), o.bf16_decode(w), None)
    check_weights(ids, weights, score, 1.5)


def test_route_threads_and_batch_independence(request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (6, 256))
    w = bf16_randn(rng, (64, 256), 0.1)
    bias = f32_randn(rng, 64, 0.05)
    one = dsv4.route(x, w, bias, 6, 1.5, backend="cpu", threads=1)
    two = dsv4.route(x, w, bias, 6, 1.5, backend="cpu", threads=2)
    part = dsv4.route(x[4:5], w, bias, 6, 1.5, backend="cpu", threads=2)
    for a, b, c in zip(one, two, part):
        assert np.array_equal(a, b) and np.array_equal(a[4:5], c)


# ---- bad input: ValueError, outputs untouched ---------------------------------------------
def expect_error(fn, outs):
    snap = [a.copy() for a in outs]
    with pytest.raises(ValueError):
        fn()
    for a, s in zip(outs, snap):
        assert np.array_equal(a.view(np.uint8), s.view(np.uint8)), "output written on error"


def test_bad_input_rms_norm(request):
    rng = o.rng(request.node.name)
    x = bf16_randn(rng, (3, 64))
    y = o.poison((3, 64), np.uint16)
    expect_error(lambda: dsv4.rms_norm(x, np.ones(32, np.float32), out=y), [y])  # weight length
    expect_error(lambda: dsv4.rms_norm(x, None, -1.0, out=y), [y])  # eps < 0
    expect_error(lambda: dsv4.rms_norm(x, None, float("nan"), out=y), [y])
    expect_error(lambda: dsv4.rms_norm(x, np.ones(64, np.int32), out=y), [y])  # dtype
    xs = np.zeros((3, 128), np.uint16)
    xs[:] = bf16_randn(rng, (3, 128))
    ys = xs[:, 64:]  # overlaps x without being x
    expect_error(lambda: dsv4.rms_norm(xs[:, :64], None, out=ys), [xs])


def test_bad_input_mhc(request):
    rng = o.rng(request.node.name)
    T, n, D = 2, 4, 32
    x = bf16_randn(rng, (T, n, D))
    fn, scale, base = hc_site(rng, n, D)
    outs = (o.poison((T, D), np.uint16), o.poison((T, n), np.float32), o.poison((T, n, n), np.float32))
    pre = lambda **kw: dsv4.hc_pre(kw.get("x", x), kw.get("fn", fn), kw.get("scale", scale),  # noqa: E731
                                   kw.get("base", base), kw.get("iters", 20), 1e-6, kw.get("ne", 1e-6), out=outs)
    expect_error(lambda: pre(fn=fn[:, :-1]), outs)  # fn columns != n*D
    expect_error(lambda: pre(fn=fn[:-1]), outs)  # 23 mixes
    expect_error(lambda: pre(scale=scale[:2]), outs)
    expect_error(lambda: pre(base=base[:-1]), outs)
    expect_error(lambda: pre(iters=0), outs)
    expect_error(lambda: pre(ne=-1e-6), outs)
    x9 = bf16_randn(rng, (T, 9, D))
    expect_error(lambda: pre(x=x9, fn=hc_site(rng, 9, D)[0]), outs)  # n > DSV4_HC_MAX
    xs = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)  # inner stride != 1
    expect_error(lambda: pre(x=xs), outs)
    # hc_post: out overlapping the residual without being it, wrong post shape
    res = bf16_randn(rng, (T, n, D))
    xo = bf16_randn(rng, (T, D))
    post = np.ones((T, n), np.float32)
    comb = np.full((T, n, n), 0.25, np.float32)
    buf = bf16_randn(rng, (T, n, 2 * D))
    expect_error(lambda: dsv4.hc_post(xo, buf[:, :, :D], post, comb, out=buf[:, :, D // 2:D // 2 + D]), [buf])
    o2 = o.poison((T, n, D), np.uint16)
    expect_error(lambda: dsv4.hc_post(xo, res, post[:, :3], comb, out=o2), [o2])
    expect_error(lambda: dsv4.hc_post(xo[:, :-1], res, post, comb, out=o2), [o2])


def test_bad_input_route(request):
    rng = o.rng(request.node.name)
    T, E, D, k, V = 3, 16, 32, 6, 10
    x = bf16_randn(rng, (T, D))
    w = bf16_randn(rng, (E, D))
    bias = np.zeros(E, np.float32)
    ids, wts = o.poison((T, k), np.int32), o.poison((T, k), np.float32)
    outs = (ids, wts)
    table = np.stack([rng.permutation(E)[:k] for _ in range(V)]).astype(np.int64)
    tok = np.array([0, 3, 9], np.int64)
    expect_error(lambda: dsv4.route(x, w[:, :-1], bias, k, 1.5, out=outs), outs)  # D mismatch
    expect_error(lambda: dsv4.route(x, w, bias[:-1], k, 1.5, out=outs), outs)
    expect_error(lambda: dsv4.route(x, w, bias, k, float("inf"), out=outs), outs)
    expect_error(lambda: dsv4.route(x, w[:4], None, k, 1.5, out=outs), outs)  # topk > E
    expect_error(lambda: dsv4.route(x, w, bias, k, 1.5, tid2eid=table, token_ids=tok, out=outs), outs)  # bias+hash
    expect_error(lambda: dsv4.route(x, w, None, k, 1.5, tid2eid=table, token_ids=tok + 1, out=outs), outs)  # tok 10
    bad = table.copy()
    bad[3, 2] = E
    expect_error(lambda: dsv4.route(x, w, None, k, 1.5, tid2eid=bad, token_ids=tok, out=outs), outs)
    bad[3, 2] = -1
    expect_error(lambda: dsv4.route(x, w, None, k, 1.5, tid2eid=bad, token_ids=tok, out=outs), outs)
    expect_error(lambda: dsv4.route(x, w, None, k, 1.5, tid2eid=table[:, :5], token_ids=tok, out=outs), outs)
