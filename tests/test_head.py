"""xRFM as a differentiable head: gradients, trainable routing, refits, compile, devices."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.func import jacrev

from conftest import planted
from xrfm_torch import LaplaceKernel, LeafConfig, xRFMTree
from xrfm_torch.lit import RefitXRFM, TabularDataModule, XRFMHeadModule


def fitted_tree(trainable: bool, dtype=torch.float64, n=600, d=4, temperature=0.5) -> xRFMTree:
    X, y = planted(n, d=d, dtype=dtype)
    tree = xRFMTree(
        LaplaceKernel(3.0),
        max_leaf_size=200,
        temperature=temperature,
        keep_mass=1.0,
        max_soft_leaves=64,
        trainable_routing=trainable,
        leaf=LeafConfig(n_iters=1),
        n_trees=1,  # the routing math below is one tree's
    )
    return tree.to(dtype).fit(X, y, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("trainable", [False, True], ids=["buffers", "trainable_routing"])
def test_gradcheck_through_the_full_head(trainable):
    tree = fitted_tree(trainable)
    assert tree.n_leaves >= 3
    x = planted(6, d=4, seed=9, dtype=torch.float64)[0].requires_grad_(True)
    assert torch.autograd.gradcheck(lambda inp: tree(inp), (x,), eps=1e-6, atol=1e-5)


def test_gradcheck_wrt_routing_parameters():
    tree = fitted_tree(True)
    x = planted(6, d=4, seed=9, dtype=torch.float64)[0]
    part = tree.partition_trees()[0]
    params = (part.split_vectors_, part.thresholds_, tree.raw_temperature)
    assert all(isinstance(p, nn.Parameter) for p in params)

    # the routing math as a function of the three parameters (same function as tree(x), below):
    # rows standardized by the input map, leaves mixed, the targets' standardization undone
    from xrfm_torch.tree.routing import soft_log_weights

    xs = tree.input_map.encode(x, "identity")

    def mix(v, b, raw):
        w = torch.softmax(
            soft_log_weights(
                xs, v, b, part.temp_scale_, part.path_sign_, torch.nn.functional.softplus(raw)
            ),
            1,
        )
        leaf = torch.stack([lf(xs) for lf in part.leaf_list()], 1)  # (n, L, c)
        return tree.targets.decode((w[:, :, None] * leaf).sum(1))

    inputs = tuple(p.detach().clone().requires_grad_(True) for p in params)
    assert torch.autograd.gradcheck(mix, inputs, eps=1e-6, atol=1e-5)
    torch.testing.assert_close(mix(*[p.detach() for p in params]), tree(x))  # same function


def test_buffers_vs_parameters():
    frozen, trainable = fitted_tree(False), fitted_tree(True)
    assert list(frozen.parameters()) == []
    names = {n for n, _ in trainable.named_parameters()}
    assert names == {"raw_temperature", "trees.0.split_vectors_", "trees.0.thresholds_"}
    assert all(
        n.endswith(
            (
                "alpha_",
                "support_",
                "sqrt_m_",
                "bandwidth",
                "best_iter_",
                "val_errors_",
                "reg_",
                "offset_",
                "kind_",
                "fourier_w_",
                "fourier_b_",
                "noise_coef_",
                "noise_mean_",
                "signal_var_",
                "factor_",
            )
        )
        for n, _ in trainable.named_buffers()
        if ".leaves." in n
    )
    assert float(trainable.temperature_.detach()) == pytest.approx(0.5, rel=1e-6)


def test_trainable_state_round_trip():
    tree = fitted_tree(True)
    fresh = xRFMTree(
        LaplaceKernel(3.0),
        max_leaf_size=200,
        temperature=0.5,
        keep_mass=1.0,
        max_soft_leaves=64,
        trainable_routing=True,
        leaf=LeafConfig(n_iters=1),
    ).double()
    fresh.load_state_dict(tree.state_dict())
    x = planted(20, d=4, seed=3, dtype=torch.float64)[0]
    assert torch.equal(fresh(x), tree(x))
    assert isinstance(fresh.partition_trees()[0].split_vectors_, nn.Parameter)


def test_inside_sequential_encoder_gets_gradients():
    tree = fitted_tree(False, dtype=torch.float32)
    enc = nn.Linear(4, 4)
    with torch.no_grad():
        enc.weight.copy_(torch.eye(4))
        enc.bias.zero_()
    model = nn.Sequential(enc, tree)
    x = planted(32, d=4, seed=5)[0]
    torch.testing.assert_close(model(x), tree(x))
    model(x).pow(2).mean().backward()
    assert enc.weight.grad is not None and float(enc.weight.grad.abs().sum()) > 0
    assert list(tree.parameters()) == []  # leaf coefficients are buffers: no optimizer


@pytest.mark.slow
def test_torch_compile_matches_eager():
    tree = fitted_tree(False, dtype=torch.float32)
    x = planted(64, d=4, seed=6)[0]
    compiled = torch.compile(tree, backend="aot_eager")
    torch.testing.assert_close(compiled(x), tree(x), rtol=1e-5, atol=1e-5)


def test_get_grads_and_tree_agop():
    tree = fitted_tree(False)
    x = planted(8, d=4, seed=7, dtype=torch.float64)[0]
    g = tree.input_grads(x)  # (n, c, d)
    ref = torch.stack([jacrev(lambda xi: tree(xi[None])[0])(xi) for xi in x])
    torch.testing.assert_close(g, ref)
    G = tree.agop(x)
    torch.testing.assert_close(G, torch.einsum("ncd,nce->de", g, g) / 8)
    torch.testing.assert_close(tree.agop(diag=True), tree.agop().diagonal())
    imp = tree.feature_importance("agop")
    assert set(torch.argsort(imp, descending=True)[:2].tolist()) == {0, 1}


def test_refit_leaves_keeps_routing_parameters():
    tree = fitted_tree(True)
    part = tree.partition_trees()[0]
    v, b = part.split_vectors_, part.thresholds_
    before = [lf.alpha_.clone() for lf in tree.leaves()]
    X, y = planted(600, d=4, seed=11, dtype=torch.float64)
    tree.refit_leaves(X * 1.1, y, generator=torch.Generator().manual_seed(0))
    assert part.split_vectors_ is v and part.thresholds_ is b
    assert all(not torch.equal(a, lf.alpha_) for a, lf in zip(before, tree.leaves()))


def quiet_trainer(max_epochs: int, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=max_epochs,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def head_setup(trainable: bool):
    torch.manual_seed(0)  # the encoder's initial weights: the same whichever tests ran before
    dm = TabularDataModule("synthetic", n_samples=1500, n_features=6, seed=0, batch_size=128)
    dm.setup()
    tree = xRFMTree(
        max_leaf_size=400,
        temperature=0.5,
        trainable_routing=trainable,
        input_transform="identity",
        leaf=LeafConfig(n_iters=1),
    )
    module = XRFMHeadModule(tree, in_features=6, hidden=(32,), lr=3e-3, **dm.system_kwargs())
    return dm, module


@pytest.mark.parametrize("trainable", [False, True], ids=["buffers", "trainable_routing"])
def test_refit_callback_changes_leaves_and_lowers_training_loss(trainable):
    dm, module = head_setup(trainable)
    refit = RefitXRFM(every_n_epochs=1)
    trainer = quiet_trainer(2, callbacks=[refit])
    trainer.fit(module, datamodule=dm)
    assert refit.refits == 2
    # Move the encoder as SGD would (seeded), so the leaves' support features are stale ...
    X, y = module.raw_data["support"]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.encoder.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))

    def support_loss() -> float:
        with torch.no_grad():
            return float(((module(X) - y.reshape(-1, 1)) ** 2).mean())

    stale = support_loss()
    alphas = [lf.alpha_.clone() for lf in module.model.leaves()]
    routing = list(module.model.parameters())
    refit.on_train_epoch_end(trainer, module)  # ... then the callback's closed-form refit
    assert refit.refits == 3
    assert support_loss() < 0.7 * stale
    new = module.model.leaves()
    assert len(new) != len(alphas) or any(
        not torch.equal(a, lf.alpha_) for a, lf in zip(alphas, new)
    )
    if trainable:  # leaves only: the optimizer's routing parameters are the same objects
        assert all(a is b for a, b in zip(routing, module.model.parameters()))


def test_head_trains_encoder_and_routing():
    dm, module = head_setup(True)
    trainer = quiet_trainer(1)
    part_b: list = []

    class Grab(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            part_b.append(pl_module.model.partition_trees()[0].thresholds_.detach().clone())
            part_b.append([p.detach().clone() for p in pl_module.encoder.parameters()])

    trainer.callbacks.append(Grab())
    trainer.fit(module, datamodule=dm)
    thresholds, enc = part_b
    assert not torch.equal(thresholds, module.model.partition_trees()[0].thresholds_.detach())
    assert any(not torch.equal(a, b.detach()) for a, b in zip(enc, module.encoder.parameters()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_parity():
    tree = fitted_tree(False, dtype=torch.float32)
    x = planted(64, d=4, seed=8)[0]
    cpu = tree(x)
    gpu = tree.to("cuda")(x.cuda()).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5)
    soft_cpu = tree.cpu()(x, 0.3)
    soft_gpu = tree.to("cuda")(x.cuda(), 0.3).cpu()
    torch.testing.assert_close(soft_gpu, soft_cpu, rtol=1e-5, atol=1e-5)


def test_batch_krr_loss_is_kernel_ridge_on_the_first_half_and_differentiable():
    from sklearn.kernel_ridge import KernelRidge

    from xrfm_torch.lit.head import batch_krr_loss

    X, y = planted(40, d=3, dtype=torch.float64)
    Y = y[:, None]
    kernel, reg = LaplaceKernel(bandwidth=2.0).double(), 1e-2
    loss = batch_krr_loss(X, Y, kernel, reg)
    Ks = kernel(X[:20], X[:20]).numpy()
    ref = KernelRidge(alpha=reg, kernel="precomputed").fit(Ks, Y[:20].numpy())
    pred = ref.predict(kernel(X[20:], X[:20]).numpy())
    expected = float(((torch.from_numpy(pred) - Y[20:]) ** 2).mean())
    assert abs(float(loss) - expected) < 1e-10
    h = X.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda h: batch_krr_loss(h, Y, kernel, reg), (h,))


def test_batch_krr_training_lowers_the_in_batch_krr_loss():
    from xrfm_torch.lit.head import batch_krr_loss

    dm = TabularDataModule("synthetic", n_samples=1500, n_features=6, seed=0, batch_size=256)
    dm.setup()
    tree = xRFMTree(
        max_leaf_size=400, temperature=0.0, input_transform="identity", leaf=LeafConfig(n_iters=1)
    )
    module = XRFMHeadModule(
        tree, in_features=6, hidden=(32,), lr=1e-2, sgd_loss="batch_krr", **dm.system_kwargs()
    )
    trainer = quiet_trainer(8)
    X, y = next(iter(dm.val_dataloader()))[:2]  # a fixed batch the optimizer never sees
    t = module.encode_targets(y).reshape(len(X), 1)

    def held_loss() -> float:
        with torch.no_grad():
            return float(batch_krr_loss(module.encoder(X), t, tree.kernel, 1e-3))

    before = held_loss()
    trainer.fit(module, datamodule=dm)
    assert held_loss() < 0.9 * before
    with pytest.raises(ValueError, match="sgd_loss"):
        XRFMHeadModule(in_features=6, sgd_loss="mse")


def test_linear_sgd_loss_trains_the_encoder_then_the_tree_is_fitted_on_its_final_features():
    # the encoder's and the probe's initial weights come from the global generator: seeded here
    # (unseeded, the loss ratio below ran 0.46-0.82 with whatever state earlier tests left)
    torch.manual_seed(0)
    dm = TabularDataModule("synthetic", n_samples=1500, n_features=6, seed=0, batch_size=128)
    dm.setup()
    tree = xRFMTree(
        max_leaf_size=400, temperature=0.0, input_transform="identity", leaf=LeafConfig(n_iters=1)
    )
    module = XRFMHeadModule(
        tree, in_features=6, hidden=(32,), lr=3e-3, sgd_loss="linear", **dm.system_kwargs()
    )
    Xv, yv = next(iter(dm.val_dataloader()))[:2]

    def probe_loss() -> float:
        with torch.no_grad():
            return float(((module.probe(module.encoder(Xv))[:, 0] - yv) ** 2).mean())

    module.probe(module.encoder(Xv[:2]))  # materialize the lazy layer to measure it first
    before = probe_loss()
    trainer = quiet_trainer(6)
    trainer.fit(module, datamodule=dm)
    assert probe_loss() < 0.8 * before  # the probe and the encoder learned
    # the head was then fitted in closed form on every training row's final features
    X, y = module.raw_data["all"]
    Hv = module.features(module.raw_data["val"][0])
    again = xRFMTree(
        max_leaf_size=400, temperature=0.0, input_transform="identity", leaf=LeafConfig(n_iters=1)
    ).fit(
        module.features(X),
        y,
        Hv,
        module.raw_data["val"][1],
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(module(Xv), again(module.features(Xv)))
    # for classes the probe's loss is the cross-entropy of its logits
    clf = XRFMHeadModule(
        xRFMTree(task="classification", input_transform="identity"),
        in_features=6,
        hidden=(32,),
        sgd_loss="linear",
        task="classification",
        num_classes=3,
    )
    x, labels = torch.randn(16, 6), torch.arange(16) % 3
    clf.probe(clf.features(x))  # materialize (setup does this in a fit)
    expected = nn.functional.cross_entropy(clf.probe(clf.encoder(x)), labels)
    clf.log = lambda *a, **k: None  # type: ignore[method-assign]  (no trainer attached)
    torch.testing.assert_close(clf.training_step((x, labels), 0), expected)


def test_head_checkpoint_loads_with_weights_only_and_predicts_the_same(tmp_path):
    dm, module = head_setup(True)
    trainer = quiet_trainer(1)
    trainer.fit(module, datamodule=dm)
    path = tmp_path / "head.ckpt"
    trainer.save_checkpoint(path)
    raw = torch.load(path, weights_only=True)  # plain data only
    assert raw["state_dict"]["support_mask"].shape == module.support_mask.shape
    loaded = XRFMHeadModule.load_from_checkpoint(path, weights_only=True)
    module.eval()
    loaded.eval()
    x = torch.from_numpy(dm.data.X_test[:50])
    with torch.no_grad():
        assert torch.equal(loaded(x), module(x))
    assert torch.equal(loaded.support_mask, module.support_mask)
