"""The RWKV-7 engine equals BlinkDL's reference (the `rwkv` package) and its State behaves like a value.

Tolerances (fp32):
- logits vs the reference: 1e-5 relative to the largest logit (measured: ~1e-6; the two sides sum
  in different orders, and the reference runs the state update token by token);
- wkv7 ops: chunked / step vs the naive oracle atol 2e-5, rtol 1e-5; at the decay's lower bound
  (the hardest case for the chunk form) the same, for the default chunk, 64 and the largest, 128;
- our engine against itself (one call vs many, prefill vs decode): 1e-5 relative; snapshot/restore
  and save/load replay the same computation and must agree exactly.

Tiny models run on one thread: on a shared two-core machine two threads mostly wait for each other.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from summarize.engine import ModelNotAvailable, NonFiniteStateError, load_model
from summarize.engine.models.rwkv7 import RWKV7Model
from summarize.engine.ops.rwkv7_wkv import (
    DEFAULT_CHUNK_SIZE,
    LOG_DECAY_MIN,
    MAX_CHUNK_SIZE,
    chunk_rwkv7,
    naive_recurrent_rwkv7,
    recurrent_step_rwkv7,
)
from summarize.errors import SummarizeError
from summarize.inputs.words import count_words
from tiny_models import RWKV_TINY as TINY
from tiny_models import blinkdl_checkpoint, hf_layout

REL_TOL = 1e-5
VOCAB = TINY["vocab"]
SAMPLES = Path(__file__).resolve().parents[1] / "samples"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return blinkdl_checkpoint(tmp_path_factory.mktemp("rwkv7") / "tiny.pth", **TINY)


@pytest.fixture(scope="module")
def model(checkpoint) -> RWKV7Model:
    return load_model(checkpoint, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """BlinkDL's RWKV_x070 from the `rwkv` package, pure PyTorch on the CPU, fp32."""
    pytest.importorskip("rwkv")
    with mock.patch.dict(os.environ, {"RWKV_V7_ON": "1", "RWKV_JIT_ON": "0", "RWKV_CUDA_ON": "0"}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # it scripts its functions with torch.jit
        import rwkv.model

        if not hasattr(rwkv.model, "RWKV_x070"):
            pytest.skip("rwkv.model was imported before without RWKV_V7_ON")
        return rwkv.model.RWKV_x070(str(checkpoint.with_suffix("")), "cpu fp32")  # it appends ".pth"


def reference_logits(reference, ids: list[int]) -> torch.Tensor:
    """[T, V]: every position, from one call."""
    logits, _ = reference.forward(ids, None, full_output=True)
    return logits.reshape(len(ids), -1)


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, rel: float = REL_TOL) -> None:
    scale = want.abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x {scale:.3g}"


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- logits equal the reference -------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 17, 64, 150])  # below, at and above multiples of the chunk
def test_logits_equal_reference_in_one_call(model, reference, length):
    ids = random_ids(2, length, seed=length)
    got = model.forward(ids, model.new_state(2))
    for row in range(2):  # the reference reads one sequence at a time
        assert_logits_close(got[row], reference_logits(reference, ids[row].tolist()))


def test_logits_equal_reference_token_by_token(model, reference):
    ids = random_ids(1, 24, seed=3)[0].tolist()
    ref_state, want = None, []
    for token in ids:
        logits, ref_state = reference.forward([token], ref_state)
        want.append(logits)
    state = model.new_state(1)
    got = [model.forward(torch.tensor([[token]]), state)[0, 0] for token in ids]
    assert_logits_close(torch.stack(got), torch.stack(want))
    state = model.new_state(1)
    got = [model.decode(torch.tensor([token]), state)[0] for token in ids]
    assert_logits_close(torch.stack(got), torch.stack(want))


def test_state_equals_reference_state(model, reference):
    ids = random_ids(1, 100, seed=4)[0].tolist()
    _, ref_state = reference.forward(ids, None)  # per layer: time-mix shift, wkv [H, V, K], channel-mix shift
    state = model.new_state(1)
    model.prefill(torch.tensor([ids]), state)
    for i, layer in enumerate(state.layers):
        assert torch.allclose(layer.matrix[0].transpose(-1, -2), ref_state[3 * i + 1], atol=1e-5, rtol=1e-5)
        assert torch.allclose(layer.shift[0, 0], ref_state[3 * i], atol=1e-5)
        assert torch.allclose(layer.shift[0, 1], ref_state[3 * i + 2], atol=1e-5)


def test_config_is_read_from_the_tensors(model):
    cfg = model.cfg
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.head_size) == (VOCAB, 64, 3, 2, 32)
    assert (cfg.decay_rank, cfg.iclr_rank, cfg.value_rank, cfg.gate_rank, cfg.ffn_size) == (16, 12, 8, 24, 160)


# -- our engine against itself ----------------------------------------------------------------


def test_prefill_equals_forward_and_step_by_step(model):
    ids = random_ids(1, 90, seed=5)
    full = model.forward(ids, model.new_state(1))
    state = model.new_state(1)
    assert_logits_close(model.prefill(ids, state), full[:, -1])
    steps = model.new_state(1)
    decoded = torch.stack([model.decode(ids[:, t], steps) for t in range(ids.shape[1])], dim=1)
    assert_logits_close(decoded, full)
    for chunked, stepped in zip(state.layers, steps.layers):
        assert torch.allclose(chunked.matrix, stepped.matrix, atol=1e-5, rtol=1e-5)
        assert torch.allclose(chunked.shift, stepped.shift, atol=1e-5, rtol=1e-5)


def test_one_call_equals_many(model):
    ids = random_ids(2, 150, seed=6)
    whole = model.forward(ids, model.new_state(2))
    state = model.new_state(2)
    pieces, start = [], 0
    for size in (7, 64, 1, 50, 28):
        pieces.append(model.forward(ids[:, start : start + size], state))
        start += size
    assert_logits_close(torch.cat(pieces, dim=1), whole)


def test_state_bytes_do_not_grow(model):
    """10 and 10,000 tokens leave states of the same size: layers x (fp32 N x N per head + 2 C shifts)."""
    sizes = []
    for length in (10, 10_000):
        state = model.new_state(1)
        model.prefill(random_ids(1, length, seed=7), state)
        sizes.append(state.nbytes)
        assert all(layer.matrix.dtype == torch.float32 for layer in state.layers)
    cfg = model.cfg
    assert sizes[0] == sizes[1] == cfg.num_layers * (cfg.num_heads * cfg.head_size**2 * 4 + 2 * cfg.hidden_size * 4)


def test_snapshot_restore_reset_save_load(model, tmp_path):
    prefix, rest = random_ids(1, 40, seed=8), random_ids(1, 30, seed=9)
    state = model.new_state(1)
    model.prefill(prefix, state)
    snapshot = state.snapshot()
    first = model.forward(rest, state)
    state.restore(snapshot)
    assert torch.equal(model.forward(rest, state), first)

    state.restore(snapshot)
    state.save(tmp_path / "state.safetensors")
    loaded = model.new_state(1)
    loaded.load(tmp_path / "state.safetensors")
    assert loaded.position == 40
    assert torch.equal(model.forward(rest, loaded), first)

    state.reset()
    assert torch.equal(model.forward(rest, state), model.forward(rest, model.new_state(1)))


def test_batch_restore_from_a_batch_one_snapshot(model):
    state = model.new_state(1)
    model.prefill(random_ids(1, 20, seed=10), state)
    batch = model.new_state(3)
    batch.restore(state.snapshot())
    rows = random_ids(3, 9, seed=11)
    got = model.forward(rows, batch)
    for row in range(3):
        single = model.new_state(1)
        single.restore(state.snapshot())
        assert_logits_close(got[row : row + 1], model.forward(rows[row : row + 1], single))


# -- diagnostics ----------------------------------------------------------------------------


def test_diagnostics_on_every_layer(model):
    reports = []
    model.listener = reports.append
    try:
        state = model.new_state(2)
        model.prefill(random_ids(2, 100, seed=12), state)
        model.decode(torch.tensor([1, 2]), state)
    finally:
        model.listener = None
    assert [(r.phase, r.sequence, r.tokens) for r in reports] == [("prefill", 0, 100), ("prefill", 1, 100),
                                                                  ("decode", 0, 1), ("decode", 1, 1)]
    for report in reports:
        assert [layer.layer for layer in report.layers] == [0, 1, 2]
        assert report.state_bytes == state.nbytes // 2
        for layer in report.layers:
            assert layer.kind == "recurrent" and layer.kv_tokens is None
            assert math.isfinite(layer.state_norm) and layer.state_norm > 0
            assert math.isfinite(layer.delta_norm) and layer.delta_norm > 0
            assert math.exp(LOG_DECAY_MIN) < layer.gate_mean < 1


def test_nan_in_a_state_names_the_layer(model):
    state = model.new_state(1)
    state.layers[1].matrix[0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteStateError, match="layer 1"):
        model.prefill(random_ids(1, 5), state)


# -- loading ------------------------------------------------------------------------------------


def test_hugging_face_layout_gives_the_same_logits(tmp_path):
    # one head of 64: flash-linear-attention's group-norm eps (head_dim x norm_eps) is then BlinkDL's
    pth = blinkdl_checkpoint(tmp_path / "one-head.pth", **TINY | dict(head_size=64, layers=2))
    model = load_model(pth, device="cpu", dtype=torch.float32)
    hf_model = load_model(hf_layout(pth, tmp_path / "hf"), device="cpu", dtype=torch.float32)
    assert hf_model.cfg == model.cfg
    ids = random_ids(1, 70, seed=13)
    assert_logits_close(hf_model.forward(ids, hf_model.new_state(1)), model.forward(ids, model.new_state(1)), rel=1e-6)


def test_bfloat16_weights_keep_an_fp32_state(checkpoint, model):
    bf16 = load_model(checkpoint, device="cpu", dtype=torch.bfloat16)
    state = bf16.new_state(1)
    ids = random_ids(1, 40, seed=14)
    logits = bf16.forward(ids, state)
    assert bf16.dtype == torch.bfloat16 and all(layer.matrix.dtype == torch.float32 for layer in state.layers)
    assert_logits_close(logits, model.forward(ids, model.new_state(1)), rel=0.1)


def test_unknown_tensors_and_bad_files_are_refused(tmp_path):
    deep_embed = {"blocks.0.ffn.s_emb.weight": torch.zeros(VOCAB, 32)}  # an rwkv7a (DeepEmbed) tensor
    path = blinkdl_checkpoint(tmp_path / "variant.pth", **TINY, extra=deep_embed)
    with pytest.raises(SummarizeError, match="s_emb"):
        load_model(path, device="cpu", dtype=torch.float32)
    with pytest.raises(ModelNotAvailable):
        load_model(tmp_path / "missing.pth", device="cpu")
    pickled = tmp_path / "code.pth"
    torch.save({"emb.weight": torch.zeros(2, 2), "hook": Path("x")}, pickled)  # not a tensor: refused unread
    with pytest.raises(SummarizeError, match="not a readable PyTorch checkpoint"):
        load_model(pickled, device="cpu")


# -- the wkv7 ops -------------------------------------------------------------------------------

ATOL, RTOL = 2e-5, 1e-5


def op_inputs(T: int, *, B: int = 2, H: int = 3, N: int = 16, seed: int = 0, lowest_decay: bool = False) -> dict:
    """The model's domains: a = -kk, b = kk * iclr with kk unit, log w in [-e^-1/2, 0]."""
    gen = torch.Generator().manual_seed(seed)
    kk = F.normalize(torch.randn(B, T, H, N, generator=gen), dim=-1)
    iclr = torch.rand(B, T, H, N, generator=gen)
    log_w = LOG_DECAY_MIN * torch.sigmoid(torch.randn(B, T, H, N, generator=gen) * 2)
    if lowest_decay:  # every channel forgets as fast as it can: the widest cumulative decays
        log_w = torch.full_like(log_w, LOG_DECAY_MIN)
    return dict(
        r=torch.randn(B, T, H, N, generator=gen), log_w=log_w, k=torch.randn(B, T, H, N, generator=gen) * 0.5,
        v=torch.randn(B, T, H, N, generator=gen), a=-kk, b=kk * iclr,
    )


@pytest.mark.parametrize("T", [1, DEFAULT_CHUNK_SIZE - 1, DEFAULT_CHUNK_SIZE, 2 * DEFAULT_CHUNK_SIZE + 1, 200])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_op_equals_naive(T, with_state):
    x = op_inputs(T, seed=T)
    s0 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)) if with_state else None
    want_o, want_s = naive_recurrent_rwkv7(**x, initial_state=s0)
    o, s, _ = chunk_rwkv7(**x, initial_state=s0)
    assert torch.allclose(o, want_o, atol=ATOL, rtol=RTOL)
    assert torch.allclose(s, want_s, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("chunk_size", [DEFAULT_CHUNK_SIZE, 64, MAX_CHUNK_SIZE])
def test_chunk_op_is_accurate_at_the_lowest_decay(chunk_size):
    """Cumulative decays reach exp(-0.61 C) within a chunk; the bound on w keeps them finite."""
    x = op_inputs(300, seed=2, lowest_decay=True)
    s0 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    want_o, want_s = naive_recurrent_rwkv7(**x, initial_state=s0)
    o, s, stats = chunk_rwkv7(**x, initial_state=s0, chunk_size=chunk_size)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert torch.allclose(o, want_o, atol=ATOL, rtol=RTOL)
    assert torch.allclose(s, want_s, atol=ATOL, rtol=RTOL)
    assert torch.allclose(stats.gate_mean, torch.full((2,), math.exp(LOG_DECAY_MIN)))


def test_step_op_and_stats_equal_naive():
    T = 12
    x = op_inputs(T, seed=4)
    s0 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    want_o, want_s = naive_recurrent_rwkv7(**x, initial_state=s0)
    state, outs, deltas = s0.clone(), [], []
    for t in range(T):
        before = state.clone()
        o, stats = recurrent_step_rwkv7(**{n: v[:, t] for n, v in x.items()}, state=state, with_stats=True)
        outs.append(o)
        # what the token wrote: the new state minus the decayed old one
        written = state - before * x["log_w"][:, t].exp()[..., None]
        assert torch.allclose(stats.delta_norm, written.flatten(1).norm(dim=-1), rtol=1e-4)
        deltas.append(stats.delta_norm)
    assert torch.allclose(torch.stack(outs, dim=1), want_o, atol=ATOL, rtol=RTOL)
    assert torch.allclose(state, want_s, atol=ATOL, rtol=RTOL)
    _, _, chunk_stats = chunk_rwkv7(**x, initial_state=s0)
    assert torch.allclose(chunk_stats.delta_norm, torch.stack(deltas).mean(0), rtol=1e-4)
    assert torch.allclose(chunk_stats.state_norm, want_s.flatten(1).norm(dim=-1), rtol=1e-5)
    assert torch.allclose(chunk_stats.gate_mean, x["log_w"].exp().mean(dim=(1, 2, 3)))


# -- the whole pipeline -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_checkpoint(tmp_path_factory) -> Path:
    """A tiny model over the whole World vocabulary, so the real tokenizer's ids fit."""
    sizes = TINY | dict(vocab=65536, layers=2)
    return blinkdl_checkpoint(tmp_path_factory.mktemp("rwkv7-world") / "rwkv7-tiny-world.pth", **sizes)


@pytest.mark.parametrize("strategy", ["map-reduce", "stream"])
def test_pdf_to_summary_with_a_pth(world_checkpoint, tmp_path, strategy):
    diagnostics = tmp_path / "d.jsonl"
    pdf = sorted(SAMPLES.glob("*.pdf"))[0]
    proc = subprocess.run(
        [sys.executable, "-m", "summarize", str(pdf), "-m", str(world_checkpoint), "-n", "50", "--dtype", "float32",
         "--strategy", strategy, "--diagnostics-file", str(diagnostics)],
        capture_output=True, text=True, timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "NO_COLOR": "1", "OMP_NUM_THREADS": "1",
             "SUMMARIZE_CACHE_DIR": os.environ["SUMMARIZE_CACHE_DIR"]},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # a random model's words rarely end a sentence in budget; the pipeline then falls back to an
    # extractive summary, after the model has read the whole document and written (see below)
    assert 0 < count_words(proc.stdout) <= 50
    records = [json.loads(line) for line in diagnostics.read_text().splitlines()]
    assert {r["phase"] for r in records} == {"prefill", "decode"}
    assert len(records) % 2 == 0 and [r["layer"] for r in records[:2]] == [0, 1]  # every layer, every span
    for r in records:
        assert r["kind"] == "recurrent"
        assert math.isfinite(r["state_norm"]) and math.isfinite(r["delta_norm"])
        assert 0 < r["gate_mean"] < 1
