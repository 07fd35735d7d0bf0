"""xRFMTree's input maps: the auto choice on planted structure, map sets, plumbing, state, head."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.inputs.choice import choose_map_set
from xrfm_torch.inputs.transforms import QuantileNormal


def exact_cdist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise distances without the GEMM expansion (whose float32 rounding is ~1e-3)."""
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def lognormal_task(n: int, seed: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Four lognormal features ``exp(2 g)``; ``kind="rank"``: the target is smooth in ``g``
    (a heavy-tailed feature's ranks carry the signal); ``"sum"``: it is the sum of two raw
    features (the raw scale carries it, as in Brazilian_houses)."""
    g = torch.randn(n, 4, generator=seeded(seed), dtype=torch.float64)
    X = torch.exp(2.0 * g)
    y = torch.sin(2 * g[:, 0]) + g[:, 1] ** 2 if kind == "rank" else X[:, 0] + X[:, 1]
    return X, y


def standardized(kind: str) -> list[torch.Tensor]:
    X, y = lognormal_task(1500, 0, kind)
    Xv, yv = lognormal_task(500, 1, kind)
    Xt, yt = lognormal_task(1000, 2, kind)
    mu, sd = X.mean(0), X.std(0)
    return [((a - mu) / sd).float() for a in (X, Xv, Xt)] + [b.float() for b in (y, yv, yt)]


def fit(transform: str, X, y, Xv, yv, **kw) -> xRFMTree:
    kw = {"max_leaf_size": 2000, "leaf": LeafConfig(n_iters=2), **kw}
    return xRFMTree(input_transform=transform, **kw).fit(X, y, Xv, yv, generator=seeded())


def rmse(model: xRFMTree, X: torch.Tensor, y: torch.Tensor) -> float:
    return float(((model(X)[:, 0] - y) ** 2).mean().sqrt())


def test_auto_maps_heavy_tailed_inputs_when_their_ranks_carry_the_signal() -> None:
    X, Xv, Xt, y, yv, yt = standardized("rank")
    auto, raw = fit("auto", X, y, Xv, yv), fit("identity", X, y, Xv, yv)
    assert "identity" not in auto.input_map.names
    assert rmse(auto, Xt, yt) < 0.5 * rmse(raw, Xt, yt)  # 0.13 vs 0.69


def test_auto_keeps_the_raw_inputs_when_the_raw_scale_carries_the_signal() -> None:
    X, Xv, Xt, y, yv, yt = standardized("sum")
    auto, mapped = fit("auto", X, y, Xv, yv), fit("quantile", X, y, Xv, yv)
    assert auto.input_map.names == ["identity"]
    assert rmse(auto, Xt, yt) < 0.5 * rmse(mapped, Xt, yt)


@pytest.mark.parametrize("transform", ["quantile", "quantile+raw"])
def test_a_map_is_the_same_as_fitting_on_mapped_inputs(transform: str) -> None:
    # Fit, prediction, routing and refit all see the mapped rows, nothing else: the training
    # rows standardized with their own statistics, then (for "quantile") their normal scores.
    X, Xv, Xt, y, yv, _ = standardized("rank")
    model = fit(transform, X, y, Xv, yv, max_leaf_size=500, leaf=LeafConfig(n_iters=1), n_trees=1)
    X64 = X.double()
    center, scale = X64.mean(0).float(), X64.std(0, correction=0).float()
    qn = QuantileNormal().fit((X - center) / scale)

    def mapped(a: torch.Tensor) -> torch.Tensor:
        s = (a - center) / scale
        return qn(s) if transform == "quantile" else torch.cat([s, qn(s)], 1)

    torch.testing.assert_close(model.input_map.encode(Xt, transform), mapped(Xt))
    assert model.n_leaves > 1 and model.n_features_in_ == 4
    tree = model.partition_trees()[0]
    torch.testing.assert_close(model.leaf_ids(Xt), tree.route(mapped(Xt)), rtol=0, atol=0)

    def stores_rows_of(rows: torch.Tensor) -> bool:  # every support row is a mapped row
        return all(
            float(exact_cdist(leaf.support_, rows).min(1).values.max()) < 1e-5
            for leaf in model.leaves()
        )

    assert stores_rows_of(mapped(X))
    # prediction: the tree on the mapped rows, in the targets' units
    y64 = y.double()
    raw = tree(mapped(Xt), model.temperature_, keep_mass=model.keep_mass, max_leaves=12)
    expected = raw * y64.std(correction=0).float() + y64.mean().float()
    torch.testing.assert_close(model(Xt), expected)
    model.refit_leaves(Xv, yv, generator=seeded(3))
    assert stores_rows_of(mapped(Xv))
    # importance: per input feature, the two columns of quantile+raw added
    diag_m = sum(
        (leaf.M if leaf.M.ndim == 1 else leaf.M.diagonal()) * leaf.support_.shape[0]
        for leaf in model.leaves()
    )
    folded = diag_m if transform == "quantile" else diag_m[:4] + diag_m[4:]
    torch.testing.assert_close(model.feature_importance(), (folded / folded.sum()).double())


def test_state_dict_restores_the_chosen_map_and_its_knots() -> None:
    X, Xv, Xt, y, yv, _ = standardized("rank")
    model = fit("auto", X, y, Xv, yv)
    fresh = xRFMTree.from_config(model.get_config())
    fresh.load_state_dict(model.state_dict())
    assert fresh.input_map.names == model.input_map.names != ["identity"]
    torch.testing.assert_close(fresh(Xt), model(Xt), rtol=0, atol=0)


def test_gradients_are_taken_through_the_map() -> None:
    X, Xv, Xt, y, yv, _ = standardized("rank")
    model = fit("quantile", X.double(), y.double(), Xv.double(), yv.double(), temperature=0.0)
    x = Xt[:10].double()
    grads = model.input_grads(x)[:, 0]  # (10, 4), by autograd through the map
    jac = torch.func.jacrev(lambda r: model(r[None])[0, 0])
    expected = torch.stack([jac(row) for row in x])
    torch.testing.assert_close(grads, expected)
    # finite differences in the raw inputs: the gradients include the map's slope
    h = 1e-6
    e0 = torch.zeros(4, dtype=torch.float64)
    e0[0] = h
    fd = (model(x + e0) - model(x - e0))[:, 0] / (2 * h)
    torch.testing.assert_close(grads[:, 0], fd, rtol=1e-4, atol=1e-6)


def test_bad_input_transform_is_named() -> None:
    with pytest.raises(ValueError, match="input_transform.*'log2'"):
        xRFMTree(input_transform="log2")
    with pytest.raises(ValueError, match="input_margin"):
        xRFMTree(input_margin=-1.0)


def test_a_head_refuses_a_tree_that_maps_its_inputs() -> None:
    from xrfm_torch.lit import XRFMHeadModule

    with pytest.raises(ValueError, match="input_transform='identity'"):
        XRFMHeadModule(xRFMTree(input_transform="quantile"), in_features=3)
    tree = xRFMTree()  # "auto" is refused too, and the caller's tree is left as it was
    with pytest.raises(ValueError, match="got input_transform='auto'"):
        XRFMHeadModule(tree, in_features=3)
    assert tree.input_transform == "auto"
    assert XRFMHeadModule(in_features=3).model.input_transform == "identity"  # the default head


def test_the_set_rule_averages_maps_whose_errors_are_independent() -> None:
    g = seeded(5)
    y = torch.randn(4000, 1, generator=g)

    def noisy(scale: float) -> torch.Tensor:
        return y + scale * torch.randn(4000, 1, generator=g)

    preds = {"identity": noisy(1.0), "quantile": noisy(1.0), "quantile+raw": noisy(1.0)}
    # equal, independent errors: a pair halves the error variance, the triple thirds it
    assert choose_map_set(preds, y, 1, 2.0) == ["identity"]  # no single map wins
    assert choose_map_set(preds, y, 2, 2.0) == ["identity", "quantile"]
    assert choose_map_set(preds, y, 3, 2.0) == list(preds)
    # one map much better: averaging it with a noisier one (MSE (1 + 0.09) / 4) loses to it alone
    preds["quantile"] = noisy(0.3)
    assert choose_map_set(preds, y, 3, 2.0) == ["quantile"]


def test_a_list_of_maps_averages_one_tree_per_map() -> None:
    # The trees are those of the single-map models fitted with the same seed, with leaves of
    # at most set_leaf_fraction * max_leaf_size rows.
    X, Xv, Xt, y, yv, yt = standardized("rank")
    kw = {"max_leaf_size": 500, "leaf": LeafConfig(n_iters=1), "temperature": 0.0, "n_trees": 1}
    both = xRFMTree(input_transform=["identity", "quantile"], **{**kw, "max_leaf_size": 1000}).fit(
        X, y, Xv, yv, generator=seeded(4)
    )
    raw = xRFMTree(input_transform="identity", **kw).fit(X, y, Xv, yv, generator=seeded(4))
    mapped = xRFMTree(input_transform="quantile", **kw).fit(X, y, Xv, yv, generator=seeded(4))
    assert both.input_map.names == ["identity", "quantile"]
    assert both.n_leaves == raw.n_leaves + mapped.n_leaves
    wide = xRFMTree(input_transform="identity", **{**kw, "max_leaf_size": 1000})
    assert raw.n_leaves > wide.fit(X, y, Xv, yv, generator=seeded(4)).n_leaves
    torch.testing.assert_close(both(Xt), (raw(Xt) + mapped(Xt)) / 2)
    torch.testing.assert_close(both.leaf_ids(Xt, tree=1), mapped.leaf_ids(Xt), rtol=0, atol=0)
    # importance: the trees' importances weighted by their leaves' support rows
    n_raw, n_mapped = (sum(lf.support_.shape[0] for lf in m.leaves()) for m in (raw, mapped))
    mix = raw.feature_importance() * n_raw + mapped.feature_importance() * n_mapped
    torch.testing.assert_close(both.feature_importance(), mix / mix.sum())
    with pytest.raises(ValueError, match="different input maps"):
        both.agop()  # leaves see raw inputs in one tree and scores in the other
    # the temperature search scores the averaged soft predictions, each tree on its own map
    grid = [0.0, 0.1, 1.0]
    errs = both.temperature_errors(Xv, yv, grid)
    sd = float(y.double().std(correction=0))  # errors are of the standardized targets
    direct = [float((((both(Xv, temperature=t)[:, 0] - yv) / sd) ** 2).mean()) for t in grid]
    # float32 predictions summed in two orders (batched per leaf vs forward): agree to ~1e-5
    assert errs == pytest.approx(direct, rel=1e-4)
    assert len(set(errs)) == 3  # soft routing changes the predictions
    # refit: each tree re-solved on its own map of the new rows
    both.refit_leaves(Xv, yv, Xt, yt, generator=seeded(6))
    raw.refit_leaves(Xv, yv, Xt, yt, generator=seeded(6))
    mapped.refit_leaves(Xv, yv, Xt, yt, generator=seeded(6))
    torch.testing.assert_close(both(Xt), (raw(Xt) + mapped(Xt)) / 2)
    fresh = xRFMTree.from_config(both.get_config())
    assert fresh.get_config()["config"]["input_transform"] == ["identity", "quantile"]
    fresh.load_state_dict(both.state_dict())
    assert fresh.input_map.names == ["identity", "quantile"]
    torch.testing.assert_close(fresh(Xt), both(Xt), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [[], ["identity", "identity"], ["identity", "log2"], 3])
def test_bad_map_lists_are_named(bad) -> None:
    with pytest.raises(ValueError, match="input_transform"):
        xRFMTree(input_transform=bad)
    with pytest.raises(ValueError, match="max_input_maps"):
        xRFMTree(max_input_maps=4)
    with pytest.raises(ValueError, match="set_leaf_fraction"):
        xRFMTree(set_leaf_fraction=0.0)


def test_n_features_in_follows_the_last_fit_not_stale_knots() -> None:
    X, Xv, Xt, y, yv, _ = standardized("rank")
    model = fit("quantile+raw", X, y, Xv, yv)
    assert model.n_features_in_ == 4
    model.input_transform = "identity"  # the knots of the first fit stay in the buffers
    model.fit(X[:, :3], y, Xv[:, :3], yv, generator=seeded())
    assert model.n_features_in_ == 3
    assert model(Xt[:, :3]).shape == (Xt.shape[0], 1)


def test_a_probe_leaf_stops_two_steps_after_its_last_gain(monkeypatch) -> None:
    # the probe's leaves have a fixed budget of PROBE_ITERS updates, but stop early once
    # PROBE_PATIENCE steps bring no gain (their later steps rarely changed the choice)
    from xrfm_torch.inputs import choice
    from xrfm_torch.leaf import LeafRFM

    probes: list[LeafRFM] = []

    class Recorded(LeafRFM):
        def fit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            probes.append(self)
            return super().fit(*args, **kwargs)

    monkeypatch.setattr(choice, "LeafRFM", Recorded)
    X, Xv, _, y, yv, _ = standardized("sum")
    fit("auto", X, y, Xv, yv)
    assert len(probes) == 3  # one per probed map
    steps = [int(p.val_errors_.isfinite().sum()) for p in probes]
    for p, n in zip(probes, steps):
        assert p.config.patience == choice.PROBE_PATIENCE == 2 and p.config.min_iters == 0
        assert n <= min(choice.PROBE_ITERS, int(p.best_iter_) + choice.PROBE_PATIENCE) + 1
    assert min(steps) < choice.PROBE_ITERS + 1  # some probe stopped before its budget


def test_a_large_fit_grows_on_one_map_where_a_smaller_one_averages_two() -> None:
    # Planted: the target is linear in one feature's normal scores and in another's raw value,
    # plus noise, so the probe's raw and quantile leaves err differently and their average wins.
    # A large fit's "auto" probe chooses among single maps (a set halves the leaves, and a
    # large fit's accuracy follows its leaves' size); a given max_input_maps is kept.
    def task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.randn(n, 4, generator=seeded(seed), dtype=torch.float64)
        noise = torch.randn(n, generator=seeded(seed + 10), dtype=torch.float64)
        return torch.exp(g), g[:, 0] + 0.2 * torch.exp(g[:, 1]) + 0.5 * noise

    (X, y), (Xv, yv) = task(1500, 0), task(2000, 100)
    mu, sd = X.mean(0), X.std(0)
    X, Xv, y, yv = ((X - mu) / sd).float(), ((Xv - mu) / sd).float(), y.float(), yv.float()
    kw = {"max_leaf_size": 2000, "leaf": LeafConfig(n_iters=2)}

    def maps(**more) -> object:
        return xRFMTree(**kw, **more).choose_input_maps(X, y, Xv, yv, generator=seeded())

    assert maps() == ("identity", "quantile")
    assert maps(large_fit_rows=1000, max_input_maps=2) == ("identity", "quantile")
    large = xRFMTree(**kw, large_fit_rows=1000).fit(X, y, Xv, yv, generator=seeded())
    assert len(large.input_map.names) == 1
    one = xRFMTree(**kw, large_fit_rows=1000, max_input_maps=1).fit(
        X, y, Xv, yv, generator=seeded()
    )
    assert large.input_map.names == one.input_map.names
    torch.testing.assert_close(large(Xv), one(Xv), rtol=0, atol=0)


class FakeClock:
    """``time.perf_counter`` that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("abort", [False, True])
def test_a_degrading_deadline_keeps_half_its_time_from_the_probe_for_the_tree(
    monkeypatch, abort
) -> None:
    # each probe leaf takes 3 s of a 10 s limit: under a degrading deadline (a candidate that
    # must end with a model) the probe stops where its next leaf would end in the half it keeps
    # for the tree (3 + 3 > 10 / 2), and the tree grows on the raw inputs it probed; a
    # candidate that may be dropped (an aborting deadline) probes as long as there is time
    from xrfm_torch.inputs import choice
    from xrfm_torch.leaf import LeafRFM, iteration
    from xrfm_torch.numerics import deadline

    clock = FakeClock()
    monkeypatch.setattr(choice, "time", clock)
    monkeypatch.setattr(deadline, "time", clock)
    # the leaves' own cost estimates read the same clock: on a busy machine real seconds of an
    # iteration would otherwise end the last second of the limit
    monkeypatch.setattr(iteration, "time", clock)
    probes: list[LeafRFM] = []

    class Timed(LeafRFM):
        def fit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            probes.append(self)
            out = super().fit(*args, **kwargs)
            clock.now += 3.0
            return out

    monkeypatch.setattr(choice, "LeafRFM", Timed)
    X, Xv, _, y, yv, _ = standardized("rank")  # probed in full, the ranks win
    with deadline.within(10.0, abort=abort):
        model = fit("auto", X, y, Xv, yv)
    assert len(probes) == (3 if abort else 1)
    assert (list(model.input_map.names) == ["identity"]) is not abort
