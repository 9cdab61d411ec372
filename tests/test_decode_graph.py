"""The static decode step (agents/graph.py) and the counter-based sampler it needs: the static step equals
the dynamic loop, compiles without a graph break (the CPU's proxy for "a CUDA graph can hold it"), and on
CUDA its captured graph equals it; the random numbers are uniform, keyed by (key, step, token) and the same
on every device; the exponential race draws each token with its probability.

Runs on ``--device`` (the CPU by default; ``make test-gpu`` runs it on CUDA).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import math

import pytest
import torch
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy
from agents.graph import StaticDecode, length_bucket, row_bucket
from agents.sampling import race_draw, row_keys, uniform_noise
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("helper", "main")
SAMPLINGS = [
    dict(greedy=True),
    dict(temperature=0.9, top_k=10),
    dict(temperature=0.7, top_p=0.9, top_k=50),
    dict(temperature=1.3, top_p=0.6),
    dict(temperature=1.0),  # nothing truncates: a race over the whole vocabulary
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def make_policy(tokenizer, dtype=torch.float32):
    model = tiny_model(tokenizer, seed=0, extra_eos=range(1000, 2500)).to(dtype)
    policy = MultiAgentPolicy(model, tokenizer, AGENTS, lora=LoraSettings(rank=4))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # distinct, non-zero adapters
        for agent in policy.agents:
            for param in policy.parameters(agent):
                param.add_((0.5 * torch.randn(param.shape, generator=gen)).to(param.device))
    return policy


def batch(tokenizer, n: int):
    rows = [tokenizer.encode("word " * (1 + (i * 3) % 7) + f"question {i}?") for i in range(n)]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def run(policy, mode: str, prompts, samples: int, seeds=None, **sampling):
    policy.engine.decode = mode
    try:
        torch.manual_seed(7)
        return policy.generate_joint(prompts, samples, max_new_tokens=14, seeds=seeds, **sampling)
    finally:
        policy.engine.decode = "auto"


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "global-rng"])
def test_static_step_equals_dynamic_loop(tokenizer, sampling, seeded):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}  # 2 agents x 3 prompts x 2 samples = 12 rows: 4 pad rows in the bucket
    seeds = [3, 4, 5] if seeded else None
    dynamic = run(policy, "dynamic", prompts, 2, seeds, **sampling)
    static = run(policy, "static", prompts, 2, seeds, **sampling)
    assert policy.engine.last_fallback is None
    lengths = set()
    for agent in AGENTS:
        assert torch.equal(static[agent].response_ids, dynamic[agent].response_ids)
        assert torch.equal(static[agent].response_mask, dynamic[agent].response_mask)
        torch.testing.assert_close(static[agent].logprobs, dynamic[agent].logprobs, atol=1e-5, rtol=1e-5)
        lengths |= set(static[agent].response_mask.sum(1).tolist())
    assert len(lengths) > 1  # rows ended at different steps: finished rows stepped on beside live ones


def test_static_decoder_is_reused_and_refreshes_adapters(tokenizer):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}
    first = run(policy, "static", prompts, 2, [1, 2, 3], temperature=0.8, top_k=20)
    assert len(policy.engine._static) == 1
    with torch.no_grad():  # a training step changes the adapters between calls
        for param in policy.parameters("main"):
            param.add_(torch.randn_like(param))
    longer = batch(tokenizer, 3)[0].new_full((3, 5), tokenizer.pad_token_id)
    wider = {a: (torch.cat([longer, ids], 1), torch.cat([torch.zeros_like(longer), mask], 1)) for a in AGENTS}
    second = run(policy, "static", wider, 2, [1, 2, 3], temperature=0.8, top_k=20)
    assert len(policy.engine._static) == 1  # the wider prompts fit the same bucket: one decoder
    dynamic = run(policy, "dynamic", wider, 2, [1, 2, 3], temperature=0.8, top_k=20)
    for agent in AGENTS:
        assert torch.equal(second[agent].response_ids, dynamic[agent].response_ids)
    assert torch.equal(first["helper"].response_ids, second["helper"].response_ids)  # pads change nothing
    assert not torch.equal(first["main"].logprobs, second["main"].logprobs)  # the new adapter ran


def test_calls_the_static_step_does_not_cover_fall_back(tokenizer):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 2)
    out = run(policy, "static", {a: (ids, mask) for a in AGENTS}, 2, [1, 2], top_k=5, repetition_penalty=1.2)
    assert "repetition penalty" in policy.engine.last_fallback
    assert out["main"].response_ids.shape[0] == 4
    policy.engine.decode = "sideways"
    with pytest.raises(ValueError, match="decode must be one of"):
        policy.generate_joint({a: (ids, mask) for a in AGENTS}, 1, max_new_tokens=3)
    policy.engine.decode = "auto"


def static_decoder(policy, tokenizer, **sampling) -> StaticDecode:
    ids, mask = batch(tokenizer, 2)
    run(policy, "static", {a: (ids, mask) for a in AGENTS}, 2, [1, 2], **sampling)
    (decoder,) = policy.engine._static.values()
    return decoder


def state(decoder: StaticDecode) -> dict[str, torch.Tensor]:
    names = ["last", "position", "key_mask", "live", "lengths", "out_ids", "out_logprobs", "t"]
    caches = {f"cache {i} {j}": kv.clone() for i, pair in enumerate(decoder.caches) for j, kv in enumerate(pair)}
    return {name: getattr(decoder, name).clone() for name in names} | caches


def restore(decoder: StaticDecode, saved: dict[str, torch.Tensor]) -> None:
    for name, value in saved.items():
        if name.startswith("cache "):
            i, j = map(int, name.split()[1:])
            decoder.caches[i][j].copy_(value)
        else:
            getattr(decoder, name).copy_(value)


def test_static_step_compiles_without_a_graph_break(tokenizer):
    """``fullgraph=True`` fails on anything a CUDA graph cannot hold: a host synchronisation (``.item()``,
    ``bool(tensor)``), a branch on a tensor's value, a shape that depends on values."""
    policy = make_policy(tokenizer)
    decoder = static_decoder(policy, tokenizer, temperature=0.7, top_p=0.9, top_k=50)
    decoder.width.fill_(8)
    decoder.t.zero_()
    decoder.live.fill_(True)
    decoder.key_mask[:, :8] = True
    saved = state(decoder)
    torch._dynamo.reset()
    compiled = torch.compile(decoder.step, fullgraph=True, backend="eager")
    with torch.no_grad():
        for _ in range(2):
            compiled()
    after_compiled = state(decoder)
    restore(decoder, saved)
    with torch.no_grad():
        for _ in range(2):
            decoder.step()
    for name, value in state(decoder).items():
        torch.testing.assert_close(after_compiled[name], value, msg=name)
    assert int(decoder.t) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU: run `make test-gpu` on one")
def test_captured_graph_equals_the_eager_static_step(tokenizer, device):
    if device.type != "cuda":
        pytest.skip("run with --device cuda (make test-gpu)")
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}
    for sampling in SAMPLINGS[:3]:
        eager = run(policy, "static", prompts, 2, [3, 4, 5], **sampling)
        graph = run(policy, "graph", prompts, 2, [3, 4, 5], **sampling)
        again = run(policy, "auto", prompts, 2, [3, 4, 5], **sampling)  # auto on CUDA: the graph, replayed again
        for agent in AGENTS:
            assert torch.equal(graph[agent].response_ids, eager[agent].response_ids)
            assert torch.equal(again[agent].response_ids, eager[agent].response_ids)
            torch.testing.assert_close(graph[agent].logprobs, eager[agent].logprobs, atol=1e-5, rtol=1e-5)
    assert any(d.graph is not None for d in policy.engine._static.values())


def test_a_dropped_static_decoder_is_freed_without_a_collection(tokenizer, monkeypatch):
    """A decoder dropped from the engine's cache (least recently used) frees its KV cache (and on a GPU its
    graph, whose blocks in the engine's pool the next capture reuses) at once: nothing but the cache refers
    to it, no reference cycle waits for the garbage collector. Also compiled: the compiled callable keeps
    what it was given, as torch.compile's does (a stand-in here; with dynamo's eager backend the decoder is
    freed too, at 5 s a compile)."""
    import gc
    import weakref

    from agents import engine as engine_module
    from agents import graph

    def compile(fn, **_settings):
        return lambda *args: fn(*args)

    monkeypatch.setattr(graph.torch, "compile", compile)
    monkeypatch.setattr(engine_module, "MAX_GRAPHS", 1)  # the second decoder drops the first
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 2)
    prompts = {a: (ids, mask) for a in AGENTS}
    for compiled in (False, True):
        policy.engine.compile_step = compiled
        policy.engine.__dict__.pop("_static", None)
        gc.collect()
        gc.disable()
        try:
            dropped = None
            for i in range(2):  # another temperature, another key
                run(policy, "static", prompts, 1, [1, 2], temperature=0.5 + 0.1 * i, top_k=5)
                if i == 0:
                    (first,) = policy.engine._static.values()
                    dropped = weakref.ref(first)
                    del first
            assert len(policy.engine._static) == 1
            assert dropped() is None, f"compiled={compiled}: {gc.get_referrers(dropped())}"
        finally:
            gc.enable()
    policy.engine.compile_step = False


def test_capture_and_replay_run_on_the_decoders_own_device(tokenizer, monkeypatch):
    """Capture records on the current device's streams and a replay launches on it: both happen with the
    decoder's device made current (an agent on cuda:1 must not record an empty graph on cuda:0). The CUDA
    calls are stand-ins that record which device was current (the CPU here, the decoder's device)."""
    import contextlib

    policy = make_policy(tokenizer)
    decoder = static_decoder(policy, tokenizer, temperature=0.9, top_k=10)
    current, events = [None], []

    @contextlib.contextmanager
    def device_guard(device):
        before, current[0] = current[0], torch.device(device)
        try:
            yield
        finally:
            current[0] = before

    class Stream:
        def __init__(self, device=None):
            events.append(("stream", torch.device(device), current[0]))

        def wait_stream(self, _other):
            pass

    class Graph:
        def replay(self):
            events.append(("replay", current[0]))
            decoder.step()

    @contextlib.contextmanager
    def capturing(_graph, pool=None, stream=None):
        events.append(("capture", current[0]))
        yield

    monkeypatch.setattr(torch.cuda, "device", device_guard)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(torch.cuda, "stream", lambda _s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    decoder.capture()
    assert decoder.graph is not None and ("capture", decoder.device) in events
    assert all(e[-1] == decoder.device for e in events), events  # every CUDA call under the decoder's device
    events.clear()
    decoder.run(2, 3)
    assert events and all(e == ("replay", decoder.device) for e in events), events
    assert current[0] is None  # the guard was left


def test_the_decoders_of_one_engine_capture_into_one_pool(tokenizer, monkeypatch):
    """Every static decoder of one engine captures into the engine's one memory pool, on its one capture
    stream (its warm-up steps too: a pool's free blocks serve the captures of their stream); another engine
    has a pool of its own. The CUDA calls are stand-ins that record what the captures were given."""
    import contextlib
    import itertools

    handles, captures, warmups = itertools.count(), [], []

    class Stream:
        def __init__(self, device=None):
            self.device = device

        def wait_stream(self, _other):
            pass

    class Graph:
        def replay(self):
            pass

    @contextlib.contextmanager
    def capturing(graph, pool=None, stream=None):
        captures.append((pool, stream))
        yield

    @contextlib.contextmanager
    def on_stream(stream):
        warmups.append(stream)
        yield

    monkeypatch.setattr(torch.cuda, "device", lambda _device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", next(handles)))
    ids, mask = batch(tokenizer, 2)
    prompts = {a: (ids, mask) for a in AGENTS}
    pools = []
    for _engine in range(2):
        policy = make_policy(tokenizer)
        monkeypatch.setattr(policy.engine, "_decode_mode", lambda _device, static_ok: "graph")
        captures.clear()
        warmups.clear()
        for temperature in (0.5, 0.6, 0.7):  # three keys: three decoders, three captures
            policy.generate_joint(prompts, 1, max_new_tokens=2, temperature=temperature, top_k=5)
        assert len(policy.engine._static) == 3 and all(d.graph is not None for d in policy.engine._static.values())
        assert len(captures) == 3 and len({pool for pool, _ in captures}) == 1
        assert all(stream is captures[0][1] for _, stream in captures) and captures[0][1] is not None
        assert warmups and all(stream is captures[0][1] for stream in warmups)
        pools.append(captures[0][0])
    assert pools[0] != pools[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU: run `make test-gpu` on one")
def test_graphs_sharing_the_engines_pool_replay_in_any_order(tokenizer, device):
    """Decoders captured into the engine's one pool, replayed alternately (one decoder's call between two of
    another's), each give its eager static step's tokens: no replay reads what another left in the pool."""
    if device.type != "cuda":
        pytest.skip("run with --device cuda (make test-gpu)")
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}
    settings = [dict(temperature=0.9, top_k=10), dict(temperature=0.7, top_p=0.9, top_k=50)]
    eager = [run(policy, "static", prompts, 2, [3, 4, 5], **s) for s in settings]
    for _ in range(2):
        for expected, sampling in zip(eager, settings):
            graph = run(policy, "graph", prompts, 2, [3, 4, 5], **sampling)
            for agent in AGENTS:
                assert torch.equal(graph[agent].response_ids, expected[agent].response_ids)
                torch.testing.assert_close(graph[agent].logprobs, expected[agent].logprobs, atol=1e-5, rtol=1e-5)
    graphs = [d.graph for d in policy.engine._static.values() if d.graph is not None]
    assert len(graphs) == 2 and graphs[0].pool() == graphs[1].pool()


def test_static_decoder_follows_a_weight_replaced_in_any_layer(tokenizer):
    """The fused weights (and the static decoders built on them) follow a base weight replaced in any layer,
    not only in the first and the last: here the first layer's MLP down projection and the last layer's q."""
    policy = make_policy(tokenizer)
    engine = policy.engine
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}
    sampling = dict(temperature=0.8, top_k=20)
    before = run(policy, "static", prompts, 2, [1, 2, 3], **sampling)
    layers = engine.causal_lm.model.layers
    for module in (layers[0].mlp.down_proj, layers[-1].self_attn.q_proj):
        base = getattr(module, "base_layer", module)
        gen = torch.Generator().manual_seed(5)
        replaced = torch.nn.Parameter(base.weight.detach() + torch.randn(base.weight.shape, generator=gen).to(
            base.weight), requires_grad=False)
        old = engine._weights()
        base.weight = replaced
        fused = engine._weights()
        assert fused is not old
        static = run(policy, "static", prompts, 2, [1, 2, 3], **sampling)
        assert any(d.weights is fused for d in engine._static.values())  # a decoder over the new weights ran
        dynamic = run(policy, "dynamic", prompts, 2, [1, 2, 3], **sampling)
        for agent in AGENTS:
            assert torch.equal(static[agent].response_ids, dynamic[agent].response_ids)
            torch.testing.assert_close(static[agent].logprobs, dynamic[agent].logprobs)
        assert not torch.equal(static["main"].logprobs, before["main"].logprobs)
    weight = getattr(layers[0].mlp.down_proj, "base_layer", layers[0].mlp.down_proj).weight
    assert engine._weights()[0]["down"].weight.data_ptr() == weight.data_ptr()


def test_buckets():
    assert [row_bucket(n) for n in (1, 8, 9, 12, 32, 33, 256)] == [8, 8, 16, 16, 32, 64, 256]
    assert [length_bucket(n) for n in (1, 128, 129, 300)] == [128, 128, 256, 384]


# ---------------------------------------------------------------- the random numbers and the draw


def test_uniform_noise_is_uniform_and_keyed_by_row_step_and_token(device):
    keys = row_keys(list(range(64)), 64, device)
    tokens = torch.arange(4096, device=device)
    u = uniform_noise(keys, 3, tokens)  # (64, 4096)
    assert u.shape == (64, 4096) and u.dtype == torch.float32
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    # 262144 numbers in 64 equal bins: chi-square with 63 degrees of freedom (mean 63, sd ~11.2).
    counts = torch.histc(u.cpu(), bins=64, min=0.0, max=1.0)
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    assert chi2 < 63 + 5 * math.sqrt(2 * 63)
    # Neighbouring keys, steps and tokens are unrelated: correlations near 0 (sd ~ 1/sqrt(n)).
    for other in (uniform_noise(keys, 4, tokens), uniform_noise(keys.roll(1, 0), 3, tokens), u.roll(1, 1)):
        corr = torch.corrcoef(torch.stack([u.flatten(), other.flatten()]).cpu())[0, 1]
        assert abs(float(corr)) < 0.01
    # A row's numbers are a function of its key, step and token alone.
    again = uniform_noise(keys[5:7], torch.tensor([3], device=device), tokens[100:200])
    assert torch.equal(again, u[5:7, 100:200])
    unseeded = row_keys(None, 4, device)
    assert unseeded[:, 0].tolist() == [0, 1, 2, 3] and len(set(unseeded[:, 1].tolist())) == 1


def test_uniform_noise_is_the_same_on_every_device(device):
    keys = row_keys([0, 1, 2**32 - 1, 123456789], 4, "cpu")
    tokens = torch.arange(49152)
    here = uniform_noise(keys.to(device), 17, tokens.to(device)).cpu()
    # Values worked out once on the CPU (integer ops: any device and kernel set gives these bits).
    cpu = uniform_noise(keys, 17, tokens)
    assert torch.equal(here, cpu)
    assert [round(float(x), 6) for x in cpu[0, :3]] == EXPECTED_FIRST_NUMBERS


EXPECTED_FIRST_NUMBERS = [0.688017, 0.963546, 0.432235]


def test_race_draws_each_token_with_its_probability(device):
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0], device=device)
    draws = 40000
    keys = row_keys(list(range(draws)), draws, device)
    listed = torch.arange(5, device=device).expand(draws, -1)
    tokens = race_draw(probs.expand(draws, -1), listed, keys, 0)
    whole = race_draw(probs.expand(draws, -1), None, keys, 0)  # the untruncated path: inverse CDF
    for drawn in (tokens, whole):
        counts = torch.bincount(drawn, minlength=5).cpu().double()
        expected = probs.cpu().double() * draws
        assert counts[4] == 0  # a token of probability 0 never wins
        chi2 = float(((counts[:4] - expected[:4]) ** 2 / expected[:4]).sum())
        assert chi2 < 3 + 5 * math.sqrt(2 * 3)  # 3 degrees of freedom
    # Unnormalised probabilities draw the same tokens.
    assert torch.equal(race_draw(3.0 * probs.expand(draws, -1), listed, keys, 0), tokens)


def test_race_draw_does_not_depend_on_which_candidates_are_listed(device):
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(32, 200, generator=gen).to(device) ** 4
    probs[:, 150:] = 0.0  # tokens 150.. cannot be drawn
    keys = row_keys(list(range(32)), 32, device)
    full = race_draw(probs, torch.arange(200, device=device).expand(32, -1), keys, 5)
    order = torch.stack([torch.randperm(150, generator=gen) for _ in range(32)]).to(device)  # shuffled, fewer
    listed = race_draw(probs.gather(1, order), order, keys, 5)
    assert torch.equal(full, listed)
    assert not torch.equal(full, race_draw(probs, torch.arange(200, device=device).expand(32, -1), keys, 6))
