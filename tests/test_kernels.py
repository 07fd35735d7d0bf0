from __future__ import annotations

import pytest
import torch
from torch.func import jacrev

from xrfm_torch.kernels import KERNELS as NAMED
from xrfm_torch.kernels import (
    GaussianKernel,
    LaplaceKernel,
    LpqLaplaceKernel,
    ProductLaplaceKernel,
    distance,
    make_kernel,
    pairwise_distance,
)
from xrfm_torch.kernels.distance import (
    CACHE_BLOCK_BYTES,
    DEVICE_BLOCK_BYTES,
    block_bytes,
    cache_blocks,
)
from xrfm_torch.kernels.lpq import kernel_values

KERNELS = [
    pytest.param(lambda: LaplaceKernel(bandwidth=3.0), id="laplace"),
    pytest.param(lambda: ProductLaplaceKernel(bandwidth=4.0), id="product_laplace"),
    pytest.param(lambda: GaussianKernel(bandwidth=2.5), id="gaussian"),
    pytest.param(lambda: LpqLaplaceKernel(bandwidth=3.0, p=1.5, q=0.7), id="lpq_1.5_0.7"),
    pytest.param(lambda: LpqLaplaceKernel(bandwidth=2.0, p=2.0, q=1.5), id="lpq_2_1.5"),
]


def reference_kernel(x, z, p, q, L):
    u = (x[:, None, :] - z[None, :, :]).abs()
    return torch.exp(-((u**p).sum(-1) ** (q / p)) / L**q)


def explicit(k, x, z, s):
    if s is not None:
        x, z = (x * s, z * s) if s.ndim == 1 else (x @ s, z @ s)
    return reference_kernel(x, z, k.p, k.q, k.bandwidth)


def data(n=30, m=20, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, d, generator=g, dtype=torch.float64),
        torch.randn(m, d, generator=g, dtype=torch.float64),
        torch.randn(m, 2, generator=g, dtype=torch.float64),
    )


def metrics(d, g):
    diag = torch.rand(d, generator=g, dtype=torch.float64) + 0.2
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    full = A @ A.T / d + 0.1 * torch.eye(d, dtype=torch.float64)
    return [None, diag, full]


@pytest.mark.parametrize("make", KERNELS)
def test_matches_formula_and_is_symmetric(make):
    k = make().double()
    x, z, _ = data()
    K = k(x, z)
    torch.testing.assert_close(
        K, reference_kernel(x, z, k.p, k.q, float(k.bandwidth)), rtol=1e-10, atol=1e-12
    )
    torch.testing.assert_close(k(z, x), K.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", KERNELS)
def test_unit_diagonal_and_psd(make):
    k = make().double()
    x, _, _ = data(n=120, d=4)
    K = k(x, x)
    torch.testing.assert_close(
        K.diagonal(), torch.ones(120, dtype=torch.float64), rtol=0, atol=1e-12
    )
    assert torch.linalg.eigvalsh(K).min() >= -1e-8 * 120


@pytest.mark.parametrize("make", KERNELS)
def test_transform_by_sqrt_m_equals_transformed_inputs(make):
    k = make().double()
    x, z, _ = data()
    for s in metrics(x.shape[1], torch.Generator().manual_seed(3))[1:]:
        xs, zs = (x * s, z * s) if s.ndim == 1 else (x @ s, z @ s)
        torch.testing.assert_close(k(x, z, s), k(xs, zs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", KERNELS)
def test_function_grads_match_jacrev(make):
    k = make().double()
    x, z, alpha = data()
    for s in metrics(x.shape[1], torch.Generator().manual_seed(4)):
        ours = k.input_grads(x, z, alpha, s)  # (n, c, d)
        # autograd through an independent implementation (torch.cdist's p != 2 backward is wrong
        # under vmap, so the reference formula is differentiated instead)
        ref = jacrev(lambda xi, s=s: explicit(k, xi[None], z, s)[0] @ alpha)  # (c, d) per row
        expected = torch.stack([ref(xi) for xi in x])
        torch.testing.assert_close(ours, expected, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("make", KERNELS)
def test_self_term_is_excluded(make):
    k = make().double()
    x, _, _ = data(n=15)
    alpha = torch.randn(15, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    ours = k.input_grads(x, x, alpha, exclude_self=True)
    for i in range(15):
        keep = torch.arange(15) != i
        ref = jacrev(lambda xi, keep=keep: explicit(k, xi[None], x[keep], None)[0] @ alpha[keep])(
            x[i]
        )
        torch.testing.assert_close(ours[i], ref, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("make", KERNELS)
def test_chunking_gives_identical_results(make):
    x, z, alpha = data(n=50, m=40)
    big = make().double()
    small = make().double()
    small.chunk_bytes = 1000  # forces several row chunks
    torch.testing.assert_close(small(x, z), big(x, z), rtol=0, atol=1e-14)
    torch.testing.assert_close(
        small.predict(x, z, alpha), big.predict(x, z, alpha), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        small.input_grads(x, z, alpha), big.input_grads(x, z, alpha), rtol=1e-10, atol=1e-12
    )


def test_duplicate_rows_have_zero_distance_in_float32():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 21, generator=g) * 30
    r = pairwise_distance(x, x, 2.0)
    assert torch.equal(r.diagonal(), torch.zeros(200))
    off = r + torch.eye(200) * 1e9
    assert off.min() > 1.0  # distinct rows are not snapped


def test_distances_of_rows_to_themselves_equal_the_general_path_bit_for_bit(monkeypatch):
    # pairwise_distance(x, x) centres and squares x once; a copy of x takes the general path
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 7, generator=g) * 5 + 2
    assert torch.equal(pairwise_distance(x, x, 2.0), pairwise_distance(x, x.clone(), 2.0))
    # and in row blocks (a buffer given, 50 rows a block)
    monkeypatch.setattr(distance, "CACHE_BLOCK_BYTES", 50 * 300 * 4)
    out = torch.empty(300, 300)
    assert len(cache_blocks(out, x)) == 6
    blocked = pairwise_distance(x, x, 2.0, out=out)
    assert torch.equal(blocked, pairwise_distance(x, x.clone(), 2.0, out=torch.empty(300, 300)))
    assert torch.equal(blocked, pairwise_distance(x, x.clone(), 2.0))


def test_duplicate_rows_contribute_no_gradient():
    k = LaplaceKernel(bandwidth=2.0)
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(1)) * 20
    z = torch.cat([x[:1], x[:1]])  # x[0] appears twice as a centre
    g = k.input_grads(x[:1], z, torch.ones(2, 1))
    assert torch.equal(g, torch.zeros(1, 1, 3))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"p": 1.0, "q": 1.5}, "0 < q <= p <= 2"),
        ({"p": 2.5, "q": 1.0}, "0 < q <= p <= 2"),
        ({"p": 2.0, "q": 0.0}, "0 < q <= p <= 2"),
        ({"bandwidth": -1.0}, "bandwidth"),
        ({"bandwidth": float("nan")}, "bandwidth"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LpqLaplaceKernel(**kwargs)


def test_make_kernel_by_name():
    assert isinstance(make_kernel("gaussian"), GaussianKernel)
    with pytest.raises(ValueError, match="unknown kernel 'rbf'"):
        make_kernel("rbf")


@pytest.mark.parametrize("p", [1.0, 1.5])
def test_lp_distance_and_grads_match_the_formula_across_cache_blocks(p):
    # 3000 float64 centres: about 87 rows per 2 MiB cache block, so 130 rows take two blocks
    g = torch.Generator().manual_seed(5)
    x = torch.randn(130, 3, generator=g, dtype=torch.float64)
    z = torch.randn(3000, 3, generator=g, dtype=torch.float64)
    alpha = torch.randn(3000, 2, generator=g, dtype=torch.float64)
    u = x[:, None, :] - z[None, :, :]  # (n, m, d)
    r_ref = (u.abs() ** p).sum(-1) ** (1 / p)
    torch.testing.assert_close(pairwise_distance(x, z, p), r_ref, rtol=1e-12, atol=1e-12)
    buf = torch.full((130, 3000), float("nan"), dtype=torch.float64)
    assert pairwise_distance(x, z, p, out=buf) is buf
    torch.testing.assert_close(buf, r_ref, rtol=1e-12, atol=1e-12)

    k = LpqLaplaceKernel(bandwidth=2.0, p=p, q=min(p, 0.8)).double()
    w = k.grad_weights(r_ref, k.from_distance(r_ref))
    phi = u.sign() * u.abs() ** (p - 1)
    expected = torch.einsum("nmd,nm,mc->ncd", phi, w, alpha)
    torch.testing.assert_close(
        k.transformed_grads(x, z, alpha, w=w.clone()), expected, rtol=1e-10, atol=1e-12
    )


def test_lp_distance_under_autograd_is_differentiable():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(4, 3, generator=g, dtype=torch.float64)
    r = pairwise_distance(x, z, 1.5)
    (gx,) = torch.autograd.grad(r.sum(), x)
    u = (x - z[:, None, :]).detach()  # (m, n, d)
    r_ref = (u.abs() ** 1.5).sum(-1) ** (1 / 1.5)  # (m, n)
    expected = (u.sign() * u.abs() ** 0.5 * r_ref[..., None] ** (1 - 1.5)).sum(0)
    torch.testing.assert_close(gx, expected, rtol=1e-10, atol=1e-12)


def test_cache_blocks_split_cpu_buffers_and_keep_device_buffers_whole():
    # A 4800 x 4800 float32 kernel matrix (88 MiB): 2 MiB blocks on the CPU, where the 4-7
    # elementwise passes then read from cache; one block elsewhere (a GPU), where each block
    # would cost a kernel launch per pass and a whole-buffer pass already runs at full bandwidth.
    cpu = torch.empty(4800, 4800)
    blocks = cache_blocks(cpu, cpu)
    rows = CACHE_BLOCK_BYTES // (4 * 4800)
    assert len(blocks) == -(-4800 // rows)
    assert [b.start for b in blocks] == list(range(0, 4800, rows))
    meta = torch.empty(4800, 4800, device="meta")
    assert cache_blocks(meta, meta) == [slice(0, 4800)]
    assert block_bytes(meta.device) == DEVICE_BLOCK_BYTES > CACHE_BLOCK_BYTES
    # the device budget still bounds a block's temporaries: a buffer over it is split
    big = torch.empty(2 * DEVICE_BLOCK_BYTES // (4 * 1024) + 3, 1024, device="meta")
    assert len(cache_blocks(big, big)) == 3


def test_in_one_block_is_where_forward_makes_the_matrix_in_one_piece():
    from xrfm_torch.kernels import LaplaceKernel

    g = torch.Generator().manual_seed(0)
    z = torch.randn(10, 2, generator=g)
    k = LaplaceKernel(chunk_bytes=10 * 4 * 3 * 5)  # float32, 10 centres: 5 rows a block
    assert k.in_one_block(torch.randn(5, 2), z) and not k.in_one_block(torch.randn(6, 2), z)
    # chunked, yet the same matrix: to the last bits, as the BLAS may round a block of 5 rows
    # and one of 6 differently (one float32 ulp on about 1 in 8 draws on some CPUs)
    for _ in range(20):
        x = torch.randn(6, 2, generator=g)
        torch.testing.assert_close(k(x, z), LaplaceKernel()(x, z), rtol=2.5e-7, atol=1.2e-7)


@pytest.mark.parametrize("name", ["laplace", "lpq", "product_laplace", "gaussian"])
@pytest.mark.parametrize("root", ["none", "shared", "diag", "full"])
def test_a_batch_of_row_sets_gives_each_sets_kernel_matrix(name, root):
    # gpytorch's convention: (..., n, d) inputs, one kernel matrix per row set
    g = torch.Generator().manual_seed(3)
    B, n, m, d = 3, 7, 5, 4
    x = torch.randn(2, B, n, d, generator=g, dtype=torch.float64)
    z = torch.randn(2, B, m, d, generator=g, dtype=torch.float64)
    roots = {
        "none": None,
        "shared": torch.rand(d, generator=g, dtype=torch.float64) + 0.5,
        "diag": torch.rand(2, B, d, generator=g, dtype=torch.float64) + 0.5,
        "full": torch.randn(2, B, d, d, generator=g, dtype=torch.float64) / 3
        + torch.eye(d, dtype=torch.float64),
    }
    s = roots[root]
    k = NAMED[name](bandwidth=1.7)
    got = k(x, z, s)
    assert got.shape == (2, B, n, m)
    for a in range(2):
        for b in range(B):
            one = s if s is None or s.ndim == 1 else s[a, b]
            torch.testing.assert_close(got[a, b], k(x[a, b], z[a, b], one), rtol=1e-10, atol=1e-12)
    # shared centres broadcast against a batch of inputs
    torch.testing.assert_close(k(x, z[0, 0]), k(x, z[0, 0].expand(2, B, m, d)), rtol=0, atol=0)


def test_kernel_values_take_one_bandwidth_and_exponent_per_row_set():
    # the lockstep's leaves: a Laplace and a Gaussian kernel's values in one batched call
    g = torch.Generator().manual_seed(4)
    r = torch.rand(2, 6, 5, generator=g, dtype=torch.float64) * 3
    kernels = [LaplaceKernel(bandwidth=2.0), GaussianKernel(bandwidth=0.75)]
    bw = torch.tensor([2.0, 0.75], dtype=torch.float64)[:, None, None]
    q = torch.tensor([k.q for k in kernels], dtype=torch.float64)[:, None, None]
    got = kernel_values(r.clone(), bw, q)
    for b, k in enumerate(kernels):
        torch.testing.assert_close(got[b], k.from_distance(r[b]), rtol=0, atol=0)
        torch.testing.assert_close(got[b], torch.exp(-((r[b] / k.bandwidth) ** k.q)))
