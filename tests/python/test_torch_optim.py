"""strata.torch.CPUAdam / CPUAdamW against torch.optim.Adam / AdamW.

100 steps on several shapes and hyper-parameter sets, per element
|a - b| <= 1e-6 * |b| + 1e-7 for the parameters (the moments: see close());
the
bf16 copy-out equal to torch's .to(bfloat16) of the fp32 result; a
state_dict round trip at step 50 that continues bit for bit; schedulers,
param groups, closures and zero_grad as torch's.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed (scripts/setup installs it)")
strata_torch = pytest.importorskip("strata.torch")
from strata.torch import CPUAdam, CPUAdamW  # noqa: E402

STEPS = 100
SHAPES = [(1,), (7,), (1000,), (100003,), (33, 65)]
HYPERS = [
    dict(lr=1e-3),
    dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0),
]


def close(a, b, moment=False):
    """Parameters: |a - b| <= 1e-6 |b| + 1e-7 per element. A moment is a
    running sum whose terms are rounded in a different order than torch's
    (fused multiply-adds): where it crosses zero its error is relative to
    its terms, so its absolute part is 1e-6 of its largest element."""
    a = a.detach().double()
    b = b.detach().double()
    bound = 1e-6 * b.abs() + (1e-6 * b.abs().max() if moment else 1e-7)
    worst = ((a - b).abs() - bound).max().item()
    return worst <= 0, worst


def grads_for(shapes, steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) * (0.1 + k % 7) for s in shapes] for k in range(steps)]


def run_pair(ours_cls, theirs_cls, shapes, kwargs, seed, scheduler=None, steps=STEPS):
    g = torch.Generator().manual_seed(seed + 1000)
    init = [torch.randn(s, generator=g) for s in shapes]
    a = [torch.nn.Parameter(t.clone()) for t in init]
    b = [torch.nn.Parameter(t.clone()) for t in init]
    oa = ours_cls(a, **kwargs)
    ob = theirs_cls(b, **kwargs)
    sa = scheduler(oa) if scheduler else None
    sb = scheduler(ob) if scheduler else None
    for step_grads in grads_for(shapes, steps, seed):
        for pa, pb, gr in zip(a, b, step_grads):
            pa.grad = gr.clone()
            pb.grad = gr.clone()
        oa.step()
        ob.step()
        if sa:
            sa.step()
            sb.step()
    return a, b, oa, ob


@pytest.mark.parametrize("ours,theirs", [(CPUAdamW, torch.optim.AdamW), (CPUAdam, torch.optim.Adam)])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("h", range(len(HYPERS)))
def test_matches_torch_over_100_steps(ours, theirs, shape, h):
    a, b, oa, ob = run_pair(ours, theirs, [shape], HYPERS[h], seed=h * 31 + len(shape))
    ok, worst = close(a[0], b[0])
    assert ok, f"params off by {worst} over the bound"
    for key in ("exp_avg", "exp_avg_sq"):
        ok, worst = close(oa.state[a[0]][key], ob.state[b[0]][key], moment=True)
        assert ok, f"{key} off by {worst} over the bound"
    assert int(oa.state[a[0]]["step"]) == STEPS


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


@pytest.mark.parametrize("ours,theirs", [(CPUAdamW, torch.optim.AdamW), (CPUAdam, torch.optim.Adam)])
def test_a_small_model_with_a_scheduler_and_param_groups(ours, theirs):
    ma = small_model()
    mb = copy.deepcopy(ma)

    def groups(m):
        decay = [p for n, p in m.named_parameters() if n.endswith("weight") and p.dim() > 1]
        rest = [p for n, p in m.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
        return [dict(params=decay, weight_decay=0.05), dict(params=rest, weight_decay=0.0, lr=2e-3)]

    oa = ours(groups(ma), lr=1e-3)
    ob = theirs(groups(mb), lr=1e-3)
    sa = torch.optim.lr_scheduler.OneCycleLR(oa, max_lr=[3e-3, 5e-3], total_steps=STEPS)
    sb = torch.optim.lr_scheduler.OneCycleLR(ob, max_lr=[3e-3, 5e-3], total_steps=STEPS)
    gen = torch.Generator().manual_seed(5)
    losses_a, losses_b = [], []
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)

        def closure(m, o, losses):
            def f():
                o.zero_grad()
                loss = torch.nn.functional.mse_loss(m(x), y)
                loss.backward()
                losses.append(loss.item())
                return loss
            return f

        ra = oa.step(closure(ma, oa, losses_a))
        ob.step(closure(mb, ob, losses_b))
        assert ra is not None
        sa.step()
        sb.step()
    assert losses_a[-1] < losses_a[0]
    for pa, pb in zip(ma.parameters(), mb.parameters()):
        ok, worst = close(pa, pb)
        assert ok, f"params off by {worst} over the bound"
    assert oa.param_groups[1]["lr"] == ob.param_groups[1]["lr"]


def test_bf16_copy_out_equals_torchs_conversion():
    p = torch.nn.Parameter(torch.randn(1000))
    out = torch.empty(1000, dtype=torch.bfloat16)
    opt = CPUAdamW([p], lr=1e-2, weights_out={p: out})
    gen = torch.Generator().manual_seed(3)
    for _ in range(5):
        p.grad = torch.randn(1000, generator=gen)
        opt.step()
        assert torch.equal(out, p.detach().to(torch.bfloat16))
    half = torch.empty(1000, dtype=torch.float16)
    opt = CPUAdamW([p], lr=1e-2, weights_out={p: half})
    opt.step()
    assert torch.equal(half, p.detach().to(torch.float16))


@pytest.mark.parametrize("state_dtype", ["fp32", "bf16", "q8"])
def test_state_dict_round_trip_at_step_50_continues_bit_for_bit(state_dtype):
    shapes = [(1000,), (7, 13)]
    gen_grads = grads_for(shapes, STEPS, seed=11)
    torch.manual_seed(1)
    init = [torch.randn(s) for s in shapes]

    def make(params):
        return CPUAdamW(params, lr=2e-3, weight_decay=0.01, state_dtype=state_dtype)

    a = [torch.nn.Parameter(t.clone()) for t in init]
    oa = make(a)
    for k in range(STEPS):
        if k == 50:
            saved = copy.deepcopy(oa.state_dict())
            saved_params = [p.detach().clone() for p in a]
        for p, g in zip(a, gen_grads[k]):
            p.grad = g.clone()
        oa.step()
    b = [torch.nn.Parameter(t) for t in saved_params]
    ob = make(b)
    ob.load_state_dict(saved)
    for key in ("exp_avg", "exp_avg_sq"):
        assert ob.state[b[0]][key].dtype == oa.state[a[0]][key].dtype
    for k in range(50, STEPS):
        for p, g in zip(b, gen_grads[k]):
            p.grad = g.clone()
        ob.step()
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
    for pa, pb in zip(a, b):
        for key, value in oa.state[pa].items():
            assert torch.equal(value, ob.state[pb][key]), key


@pytest.mark.parametrize("state_dtype", ["bf16", "q8"])
def test_low_precision_states_still_train(state_dtype):
    m = small_model()
    opt = CPUAdamW(m.parameters(), lr=3e-3, state_dtype=state_dtype)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(64, 16, generator=gen)
    y = torch.randn(64, 4, generator=gen)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        first = first if first is not None else loss.item()
        opt.step()
    assert loss.item() < 0.8 * first


def test_maximize_and_no_grad_params():
    a = torch.nn.Parameter(torch.randn(100))
    b = torch.nn.Parameter(a.detach().clone())
    skipped = torch.nn.Parameter(torch.randn(10))
    before = skipped.detach().clone()
    oa = CPUAdam([a, skipped], lr=1e-2, maximize=True)
    ob = torch.optim.Adam([b], lr=1e-2, maximize=True)
    for k in range(10):
        g = torch.randn(100, generator=torch.Generator().manual_seed(k))
        a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    assert close(a, b)[0]
    assert torch.equal(skipped, before)


def test_bad_arguments_raise():
    p = torch.nn.Parameter(torch.randn(4))
    with pytest.raises(ValueError, match="amsgrad"):
        CPUAdamW([p], amsgrad=True)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        CPUAdamW([p], lr=-1)
    with pytest.raises(ValueError, match="Invalid beta"):
        CPUAdam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="state_dtype"):
        CPUAdamW([p], state_dtype="fp8")
    with pytest.raises(TypeError, match="float32"):
        CPUAdamW([torch.nn.Parameter(torch.randn(4, dtype=torch.float64))])
    opt = CPUAdamW([p])
    p.grad = torch.randn(4).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        opt.step()
    before = p.detach().clone()
    p.grad = torch.randn(4)
    with pytest.raises(ValueError, match="lr"):
        opt.param_groups[0]["lr"] = float("nan")
        opt.step()
    assert torch.equal(p, before)
    assert "step" not in opt.state[p] or int(opt.state[p]["step"]) == 0


def test_deepspeeds_option_names():
    torch.manual_seed(2)
    init = torch.randn(300)
    grads = [torch.randn(300) for _ in range(5)]

    def run(opt_cls, **kw):
        p = torch.nn.Parameter(init.clone())
        o = opt_cls([p], lr=1e-2, weight_decay=0.1, **kw)
        for g in grads:
            p.grad = g.clone()
            o.step()
        return p.detach(), o

    # adamw_mode=True on CPUAdam is CPUAdamW, False on CPUAdamW is CPUAdam.
    assert torch.equal(run(CPUAdam, adamw_mode=True)[0], run(CPUAdamW)[0])
    assert torch.equal(run(CPUAdamW, adamw_mode=False)[0], run(CPUAdam)[0])
    assert not torch.equal(run(CPUAdam)[0], run(CPUAdamW)[0])
    p, o = run(CPUAdamW, fp32_optimizer_states=False)
    assert o.state[o.param_groups[0]["params"][0]]["exp_avg"].dtype == torch.bfloat16
    p, o = run(CPUAdamW, fp32_optimizer_states=False, state_dtype="q8")
    assert o.state[o.param_groups[0]["params"][0]]["exp_avg"].dtype == torch.int8
    with pytest.raises(ValueError, match="bias_correction"):
        CPUAdamW([torch.nn.Parameter(init.clone())], bias_correction=False)
