"""What every registered model family keeps, checked once per family on a tiny random model.

A new family in summarize/engine/models/registry.py joins every test here by a line in TINY; the
family's own file keeps only what is its own (its reference implementation, its file layouts, its op).

Tolerances (fp32): our engine against itself (one call vs many, prefill vs decode): 1e-5 relative
to the largest logit; snapshot/restore and save/load replay the same computation and must agree
exactly; bf16 weights stay within a tenth (RWKV) or a twentieth (Qwen3.5) of the largest fp32 logit.
Tiny models run on one thread: on a shared two-core machine two threads mostly wait for each other.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from summarize.engine import NonFiniteStateError, load_model
from summarize.engine.models.registry import FAMILIES, families_for_file
from summarize.engine.ops.rwkv7_wkv import LOG_DECAY_MIN
from summarize.engine.state import RecurrentLayerState
from summarize.inputs.words import count_words
from tiny_models import (
    RWKV6_TINY,
    RWKV_TINY,
    blinkdl_checkpoint,
    dense_reference,
    rwkv6_checkpoint,
    save_checkpoint,
)

SELF_TOL = 1e-5
SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def qwen3_5_recurrent_bytes(cfg) -> int:
    """Per Gated DeltaNet layer: fp32 [HV, dk, dv] matrices and the conv window of q, k and v."""
    matrices = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv_channels = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    window = conv_channels * (cfg.linear_conv_kernel_dim - 1) * 4
    return cfg.layer_types.count("linear_attention") * (matrices + window)


def rwkv_recurrent_bytes(cfg) -> int:
    """layers x (fp32 N x N per head + 2 C shift vectors), whatever was read."""
    return cfg.num_layers * (cfg.num_heads * cfg.head_size**2 * 4 + 2 * cfg.hidden_size * 4)


@dataclass(frozen=True)
class TinyFamily:
    """How to make a tiny random model of one family, and the few facts its checks depend on."""

    write: Callable[[Path], Path]  # folder -> the checkpoint written in it
    recurrent_bytes: Callable[[object], int]  # cfg -> bytes of the fixed-size state of one sequence
    bf16_tolerance: float  # relative to the largest fp32 logit
    lowest_gate: float = 0.0  # gate_mean is above it
    # bounded decays keep the state's entries near 1: two ways to the same state agree entry by
    # entry; RWKV-6's unbounded ones let entries grow, so they agree relative to the largest
    entrywise_state: bool = True
    # folder -> a checkpoint over the whole World vocabulary, for the CLI with a single weight file
    write_world: Callable[[Path], Path] | None = None


TINY = {
    "qwen3_5": TinyFamily(
        write=lambda folder: save_checkpoint(dense_reference(), folder),
        recurrent_bytes=qwen3_5_recurrent_bytes,
        bf16_tolerance=0.05,  # bf16 keeps ~3 significant digits per op
    ),
    "rwkv7": TinyFamily(
        write=lambda folder: blinkdl_checkpoint(folder / "tiny.pth", **RWKV_TINY),
        recurrent_bytes=rwkv_recurrent_bytes,
        bf16_tolerance=0.1,
        lowest_gate=math.exp(LOG_DECAY_MIN),
        write_world=lambda folder: blinkdl_checkpoint(folder / "rwkv7-tiny-world.pth", **RWKV_TINY | dict(vocab=65536, layers=2)),
    ),
    "rwkv6": TinyFamily(
        write=lambda folder: rwkv6_checkpoint(folder / "tiny.pth", **RWKV6_TINY),
        recurrent_bytes=rwkv_recurrent_bytes,
        bf16_tolerance=0.1,
        entrywise_state=False,
        write_world=lambda folder: rwkv6_checkpoint(folder / "rwkv6-tiny-world.pth", **RWKV6_TINY | dict(vocab=65536, layers=2)),
    ),
}
FAMILY_NAMES = [family.name for family in FAMILIES]


def test_every_registered_family_has_a_tiny_model():
    assert sorted(TINY) == sorted(FAMILY_NAMES)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(family, tmp_path_factory) -> Path:
    return TINY[family].write(tmp_path_factory.mktemp(family))


@pytest.fixture(scope="module")
def model(checkpoint):
    return load_model(checkpoint, device="cpu", dtype=torch.float32)


def random_ids(model, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, model.cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, rel: float = SELF_TOL) -> None:
    """|got - want| <= rel x the largest |want| (logits, or a state matrix)."""
    scale = want.abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x {scale:.3g}"


def recurrent_layers(state) -> list[tuple[int, RecurrentLayerState]]:
    return [(i, layer) for i, layer in enumerate(state.layers) if isinstance(layer, RecurrentLayerState)]


# -- one call equals many; prefill, forward and decode agree -----------------------------------


@pytest.mark.parametrize("sizes", [(7, 64, 1, 50, 28), (37, 1, 2, 1, 50)], ids=["around-a-chunk", "below-the-conv-window"])
def test_one_call_equals_many(model, sizes):
    ids = random_ids(model, 2, sum(sizes), seed=6)
    whole = model.forward(ids, model.new_state(2))
    state, pieces, start = model.new_state(2), [], 0
    for size in sizes:
        pieces.append(model.forward(ids[:, start : start + size], state))
        start += size
    assert_close_to_scale(torch.cat(pieces, dim=1), whole)


def test_prefill_equals_forward_and_step_by_step(family, model):
    ids = random_ids(model, 1, 90, seed=5)
    full = model.forward(ids, model.new_state(1))
    state = model.new_state(1)
    assert_close_to_scale(model.prefill(ids, state), full[:, -1])
    steps = model.new_state(1)
    decoded = torch.stack([model.decode(ids[:, t], steps) for t in range(ids.shape[1])], dim=1)
    assert_close_to_scale(decoded, full)
    for (_, chunked), (_, stepped) in zip(recurrent_layers(state), recurrent_layers(steps), strict=True):
        assert_close_to_scale(chunked.matrix, stepped.matrix)
        if TINY[family].entrywise_state:
            assert torch.allclose(chunked.matrix, stepped.matrix, atol=1e-5, rtol=1e-5)
        assert torch.allclose(chunked.shift, stepped.shift, atol=1e-5, rtol=1e-5)


# -- State ---------------------------------------------------------------------------------------


def test_state_bytes_are_the_same_after_10_and_10000_tokens(family, model):
    sizes = []
    for length in (10, 10_000):
        state = model.new_state(1)
        model.prefill(random_ids(model, 1, length, seed=7), state)
        for _, layer in recurrent_layers(state):
            assert layer.matrix.dtype == torch.float32 and torch.isfinite(layer.matrix).all()
        assert state.kv_tokens == (length if len(recurrent_layers(state)) < len(state.layers) else 0)  # only a KV cache grows
        sizes.append(state.recurrent_nbytes)
    assert sizes[0] == sizes[1] == TINY[family].recurrent_bytes(model.cfg)


def test_snapshot_restore_reset_save_load(model, tmp_path):
    prefix, rest = random_ids(model, 1, 40, seed=8), random_ids(model, 1, 30, seed=9)
    state = model.new_state(1)
    model.prefill(prefix, state)
    snapshot = state.snapshot()
    first = model.forward(rest, state)
    model.forward(random_ids(model, 1, 300, seed=10), state)  # grows a KV cache past its first buffer
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


def test_a_batch_one_snapshot_restores_into_a_batch(model):
    state = model.new_state(1)
    model.prefill(random_ids(model, 1, 20, seed=10), state)
    snapshot = state.snapshot()
    batch = model.new_state(3)
    batch.restore(snapshot)
    rows = random_ids(model, 3, 25, seed=11)
    got = model.forward(rows, batch)
    for row in range(3):
        state.restore(snapshot)
        assert_close_to_scale(got[row : row + 1], model.forward(rows[row : row + 1], state))

    batch.restore(snapshot)  # the same text in every row
    got = model.forward(rows[:1].expand(3, -1), batch)
    state.restore(snapshot)
    alone = model.forward(rows[:1], state)
    for row in range(3):
        assert_close_to_scale(got[row : row + 1], alone)


# -- diagnostics ---------------------------------------------------------------------------------


def test_diagnostics_on_every_layer(family, model):
    reports = []
    model.listener = reports.append
    try:
        state = model.new_state(2)
        model.prefill(random_ids(model, 2, 100, seed=12), state)
        state_bytes = {"prefill": state.nbytes}  # a KV cache grows by the decoded token
        model.decode(torch.tensor([1, 2]), state)
        state_bytes["decode"] = state.nbytes
    finally:
        model.listener = None
    assert [(r.phase, r.sequence, r.tokens) for r in reports] == [("prefill", 0, 100), ("prefill", 1, 100),
                                                                  ("decode", 0, 1), ("decode", 1, 1)]
    for report in reports:
        assert [layer.layer for layer in report.layers] == list(range(len(state.layers)))
        assert report.state_bytes == state_bytes[report.phase] // 2
        for layer in report.layers:
            if layer.kind == "attention":
                assert layer.kv_tokens == {"prefill": 100, "decode": 101}[report.phase] and layer.state_norm is None
                continue
            assert layer.kind == "recurrent" and layer.kv_tokens is None
            assert math.isfinite(layer.state_norm) and layer.state_norm > 0
            assert math.isfinite(layer.delta_norm) and layer.delta_norm > 0
            assert TINY[family].lowest_gate < layer.gate_mean < 1


def test_nan_in_a_state_names_the_layer(model):
    for i, _ in recurrent_layers(model.new_state(1)):
        state = model.new_state(1)
        state.layers[i].matrix[0, 0, 0, 0] = float("nan")
        with pytest.raises(NonFiniteStateError, match=f"layer {i}\\b"):
            model.prefill(random_ids(model, 1, 5), state)


# -- loading -------------------------------------------------------------------------------------


def test_bfloat16_weights_keep_an_fp32_state(family, checkpoint, model):
    bf16 = load_model(checkpoint, device="cpu", dtype=torch.bfloat16)
    state = bf16.new_state(1)
    ids = random_ids(model, 1, 80, seed=14)
    got = bf16.forward(ids, state).float()
    assert bf16.dtype == torch.bfloat16 and all(layer.matrix.dtype == torch.float32 for _, layer in recurrent_layers(state))
    want = model.forward(ids, model.new_state(1))
    assert_close_to_scale(got, want, TINY[family].bf16_tolerance)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.8


# -- the whole pipeline, from a single weight file ----------------------------------------------


def summarize_cli(model: Path, tmp_path: Path, *args: str) -> list[dict]:
    """Summarize the sample PDF with `model` in a fresh process: its diagnostics records."""
    diagnostics = tmp_path / "d.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "summarize", str(SAMPLES / "target-tier-policy.pdf"), "-m", str(model), "-n", "50",
         "--temperature", "0", "--dtype", "float32", "--diagnostics-file", str(diagnostics), *args],
        capture_output=True, text=True, timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "NO_COLOR": "1", "OMP_NUM_THREADS": "1",
             "SUMMARIZE_CACHE_DIR": os.environ["SUMMARIZE_CACHE_DIR"], "SUMMARIZE_CALIBRATE": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # a random model's words rarely end a sentence in budget; the pipeline then falls back to an
    # extractive summary, after the model has read the whole document and written (see below)
    assert 0 < count_words(proc.stdout) <= 50
    return [json.loads(line) for line in diagnostics.read_text().splitlines()]


def assert_every_layer_reported(records: list[dict], layers: int) -> None:
    assert {r["phase"] for r in records} == {"prefill", "decode"}
    assert len(records) % layers == 0
    for start in range(0, len(records), layers):  # one record per layer per span, layers in order
        assert [r["layer"] for r in records[start : start + layers]] == list(range(layers))
    for r in records:
        assert r["kind"] == "recurrent" and r["kv_tokens"] is None
        assert math.isfinite(r["state_norm"]) and math.isfinite(r["delta_norm"])
        assert 0 < r["gate_mean"] < 1


@pytest.fixture(scope="module")
def world_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Per family read from a single file: a tiny model over the whole World vocabulary, so that
    the real tokenizer's ids fit."""
    return {name: TINY[name].write_world(tmp_path_factory.mktemp(f"{name}-world")) for name in TINY if TINY[name].write_world}


@pytest.mark.parametrize("family_name", [family.name for family in families_for_file(".pth")])
@pytest.mark.parametrize("strategy", ["map-reduce", "stream"])
def test_pdf_to_summary_with_a_pth(world_checkpoints, tmp_path, family_name, strategy):
    assert_every_layer_reported(summarize_cli(world_checkpoints[family_name], tmp_path, "--strategy", strategy), layers=2)
