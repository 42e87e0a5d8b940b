"""check.speed, the step-time model: each term against a count by hand on small layouts, the overlaps Megatron
performs under the flags, and that the plan, the sweeper's table and speed.json show the model's own figure."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from vlmtrain.check import speed
from vlmtrain.check.memory.params import stage_params
from vlmtrain.check.speed import calibration, terms
from vlmtrain.check.speed.calibration import Calibration
from vlmtrain.check.speed.workload import from_samples
from vlmtrain.config import flops
from vlmtrain.config.resolve import resolve

CAL = Calibration(vit_fraction=0.5, dense_fraction=0.5, expert_fraction=0.25, expert_gemm_s=1e-4,
                  expert_cutlass_gemm_s=1e-5, hbm_fraction=0.5, layer_host_s=0.01, gdn_layer_host_s=0.02,
                  vit_block_host_s=0.002, fsdp_unit_host_s=0.003, image_host_s=0.004, microbatch_host_s=0.02,
                  step_host_s=0.05, host_hidden=0.0)
"""Round constants, so each term is countable by hand (the fitted ones are tested against their file below)."""
GB = 1e9


def placed(compose, *overrides: str):  # noqa: ANN001, ANN202
    run = compose("model=tiny", "parallelism=3d", *overrides)
    return run, resolve(run)


def workload(run, res, tokens: float = 300.0, images: float = 1.0):  # noqa: ANN001, ANN202
    """The GBS's samples of `tokens` real tokens, one image of 200 LLM tokens each, unpacked."""
    return from_samples(run, res, float(run.train.global_batch_size), tokens, images, 200.0, 1.0, "by hand")


def test_decoder_and_vit_flops_by_hand(compose) -> None:
    """Unpadded MBS 1 on one GPU: each micro-batch runs one sample rounded up to the collate's 128, forward and
    backward (x3) of config.flops' count; the experts' share is L x top-k x 6hf per token."""
    run, res = placed(compose, "gpus_per_node=1", "train.global_batch_size=8")
    w = workload(run, res)
    m = run.model
    f = terms.stage_flops(run, res, w, 0)
    row = 384  # 300 tokens -> the collate's next multiple of 128
    assert w.decoder_tokens == 8 * row and w.useful_tokens == 8 * 300
    assert f.dense + f.attention + f.expert == pytest.approx(3 * flops.decoder_forward(m, [row]))
    assert f.expert == pytest.approx(3 * row * m.num_layers * m.moe_topk * 6 * m.hidden_size * m.moe_ffn_hidden_size)
    assert f.attention == pytest.approx(3 * m.num_layers * 2 * m.num_attention_heads * m.head_dim * row * row)
    vit, proj = flops.vit_forward(m, [800])  # 200 tokens x 4 patches
    assert f.vit == pytest.approx(3 * (vit + proj))  # one image per micro-batch, trained ViT and projector
    vit_s, dec_s = terms.compute_s(run, res, 0, f, CAL)
    peak = run.hardware.peak_bf16_tflops * 1e12
    local = m.num_experts  # EP 1: every expert is local
    assert vit_s == pytest.approx(f.vit / (0.5 * peak))
    assert dec_s == pytest.approx((f.dense + f.attention) / (0.5 * peak) + f.expert / (0.25 * peak)
                                  + local * m.num_layers * 1e-4)


def test_full_recompute_adds_a_forward(compose) -> None:
    run, res = placed(compose, "gpus_per_node=1", "train.global_batch_size=8")
    w = workload(run, res)
    base = terms.stage_flops(run, res, w, 0)
    run.recompute = replace(run.recompute, granularity="full")
    again = terms.stage_flops(run, res, w, 0)
    assert again.dense + again.attention + again.expert == pytest.approx(
        4 / 3 * (base.dense + base.attention + base.expert))


def test_dispatch_bytes_by_hand(compose) -> None:
    """EP 8 over two nodes of 4: each of a rank's tokens goes top-k times, 3 of 8 destinations on its NVLink
    domain, 4 of 8 over the NIC; HybridEP sends a token once per remote domain (2 domains, top-2: 0.75 of it)."""
    run, res = placed(compose, "hardware=h100", "nodes=2", "gpus_per_node=4", "parallelism.ep=8",
                      "train.global_batch_size=8")
    w = workload(run, res)
    m = run.model
    assert res.padded and res.layout.dp == 8 and terms.microbatches(res) == 1  # EP > 1: Bridge pads to seq_length
    sent = res.seq_length * m.moe_topk * m.hidden_size * 2
    nvl, net = terms.dispatch_bytes(run, res, w)
    assert (nvl, net) == (pytest.approx(sent * 3 / 8), pytest.approx(sent * 4 / 8))
    per_a2a = max(nvl / (450 * GB * terms.NVLINK_FRACTION), net / (50 * GB * terms.NIC_FRACTION))
    assert terms.dispatch_s(run, res, w, 0) == pytest.approx(4 * m.num_layers * per_a2a)
    run.dispatcher = replace(run.dispatcher, backend="hybridep")
    assert terms.dispatch_bytes(run, res, w)[1] == pytest.approx(sent * 4 / 8 * 2 * (1 - 0.5**2) / 2)


def test_tensor_parallel_collectives_by_hand(compose) -> None:
    """TP 2 with sequence parallelism: 8 ring collectives of tokens x hidden BF16 per layer, each moving half of
    it; the ViT's 4 all-reduces per block move the patches x ViT hidden twice over."""
    run, res = placed(compose, "gpus_per_node=2", "parallelism.tp=2", "train.global_batch_size=8")
    w = workload(run, res)
    m = run.model
    bw = 450 * GB * terms.NVLINK_FRACTION
    tokens = w.decoder_tokens / 8  # DP 1, 8 micro-batches
    decoder = 8 * m.num_layers * (tokens * m.hidden_size * 2 / 2) / bw
    vit = 4 * m.vit.depth * (2 * 800 * m.vit.hidden_size * 2 / 2) / bw
    assert terms.tensor_parallel_s(run, res, w, 0) == pytest.approx(decoder + vit)


def test_fsdp_and_ddp_bytes_by_hand(compose) -> None:
    """Megatron-FSDP moves each unit's BF16 weights twice (forward, backward) and its FP32 gradients once per
    micro-batch; the distributed optimizer reduce-scatters FP32 gradients and all-gathers BF16 weights once per
    step, each over DP (dense) and expert-DP (experts)."""
    run, res = placed(compose, "parallelism=fsdp", "gpus_per_node=2", "parallelism.ep=1",
                      "train.global_batch_size=8")
    sp = stage_params(run, res, 0)
    dense = sp.vision + sp.projector + sp.decoder_dense
    assert terms.fsdp_bytes(run, res, 0, True) == (4 * dense + 4 * dense, 4 * sp.decoder_expert
                                                   + 4 * sp.decoder_expert)
    bw = 450 * GB * terms.NVLINK_FRACTION
    assert terms.fsdp_s(run, res, 0, True) == pytest.approx((8 * dense + 8 * sp.decoder_expert) / 2 / bw)
    assert terms.ddp_grad_s(run, res, 0, True) == (0.0, 1)  # FSDP reduces per micro-batch instead
    run3, res3 = placed(compose, "gpus_per_node=2", "parallelism.ep=1", "train.global_batch_size=8")
    sp3 = stage_params(run3, res3, 0)
    total = sp3.vision + sp3.projector + sp3.decoder
    grads, buckets = terms.ddp_grad_s(run3, res3, 0, True)
    assert grads == pytest.approx(4 * total / 2 / bw) and buckets == math.ceil(total / 40e6)
    assert terms.ddp_gather_s(run3, res3, 0, True) == pytest.approx(2 * total / 2 / bw)
    assert terms.fsdp_bytes(run3, res3, 0, True) == (0.0, 0.0)


def test_optimizer_and_host_by_hand(compose) -> None:
    """Adam reads and writes its 12 B of state, reads the FP32 gradient twice and writes the BF16 weight per
    parameter of its shard, and zeroes the local gradient buffer; host: per layer and ViT block (a frozen ViT
    launches only its forward, a third), per image under Bridge's loop, per micro-batch."""
    run, res = placed(compose, "gpus_per_node=1", "train.global_batch_size=8", "kernels=default")
    w = workload(run, res)
    sp = stage_params(run, res, 0)
    n = sp.vision + sp.projector + sp.decoder
    traffic = n * (2 * 12 + 2 * 4 + 2) + n * 4
    assert terms.optimizer_s(run, res, 0, True, CAL) == pytest.approx(traffic / (4800 * GB * 0.5))
    vit, dec, other = terms.host_s(run, res, w, 0, CAL)
    assert dec == pytest.approx(run.model.num_layers * 0.01)
    assert vit == pytest.approx(run.model.vit.depth * 0.002 + 1 * 0.004)  # one image per micro-batch, loop positions
    assert other == 0.02
    run.vision = replace(run.vision, freeze_vision_model=True, freeze_vision_projection=True)
    vit_frozen, _, _ = terms.host_s(run, res, w, 0, CAL)
    assert vit_frozen == pytest.approx(run.model.vit.depth * 0.002 / 3 + 0.004)


def test_pipeline_bubble_and_step_sum(compose) -> None:
    """PP 2, 8 micro-batches: the step is 8 micro-batches of the slower stage plus (PP - 1)/VPP of them; the
    terms add up to step_s, and the rates follow from the workload."""
    run, res = placed(compose, "gpus_per_node=2", "parallelism.pp=2", "parallelism.ep=1",
                      "train.global_batch_size=8")
    w = workload(run, res)
    t = speed.predict(run, res, w, CAL)
    per_mb = (t.vision + t.vision_host + t.decoder + t.dispatch + t.tensor_parallel + t.fsdp + t.decoder_host
              + t.host) / 8
    assert t.pipeline_bubble == pytest.approx(per_mb)
    assert t.step_s == pytest.approx(sum(getattr(t, n) for n in speed.TERMS))
    assert t.useful_tokens_per_s_per_gpu == pytest.approx(w.useful_tokens / t.step_s / 2)
    assert t.mfu == pytest.approx(w.flops.total / (t.step_s * 2 * 989e12))


def test_ddp_overlaps_follow_the_flags(compose) -> None:
    """With overlap_grad_reduce (the parallelism group's), only the last bucket or what the last backward cannot
    hide is exposed; `+bridge.ddp.overlap_grad_reduce=false` exposes all of it; the same for the gather."""
    over = ["nodes=2", "gpus_per_node=8", "hardware=h100", "parallelism.ep=1", "train.global_batch_size=16"]
    run, res = placed(compose, *over)
    w = workload(run, res)
    on = speed.predict(run, res, w, CAL)
    raw, n = terms.ddp_grad_s(run, res, 0, True)
    gather = terms.ddp_gather_s(run, res, 0, True)
    per_mb = (on.step_s - on.grad_reduce - on.param_gather - on.optimizer - on.pipeline_p2p) / 1
    assert raw > 0 and on.grad_reduce == pytest.approx(max(raw / n, raw - 2 / 3 * per_mb))
    assert on.param_gather == pytest.approx(max(gather / n, gather - 1 / 3 * per_mb))
    run_off, res_off = placed(compose, *over, "+bridge.ddp.overlap_grad_reduce=false",
                              "+bridge.ddp.overlap_param_gather=false")
    off = speed.predict(run_off, res_off, w, CAL)
    assert off.grad_reduce == pytest.approx(raw) and off.param_gather == pytest.approx(gather)
    assert off.step_s > on.step_s


def test_fsdp_hides_behind_compute_and_a2a_does_not(compose) -> None:
    """Megatron-FSDP prefetches: per micro-batch only the first unit's share or what compute cannot cover is
    exposed. The MoE all-to-all is exposed whole (no overlap_moe_expert_parallel_comm for the Qwen-VL step)."""
    run, res = placed(compose, "parallelism=fsdp", "nodes=2", "gpus_per_node=8", "hardware=h100",
                      "parallelism.ep=8", "train.global_batch_size=16")
    w = workload(run, res)
    t = speed.predict(run, res, w, CAL)
    raw = terms.fsdp_s(run, res, 0, True)
    f = terms.stage_flops(run, res, w, 0)
    vit, dec = terms.compute_s(run, res, 0, f, CAL)
    a2a = terms.dispatch_s(run, res, w, 0)
    gpu = vit + dec + a2a + terms.tensor_parallel_s(run, res, w, 0)
    mb = terms.microbatches(res)
    assert t.fsdp == pytest.approx(mb * max(raw / terms.fsdp_units(run, res, 0), raw - gpu))
    assert t.dispatch == pytest.approx(mb * a2a) and a2a > 0


def test_host_hidden_under_gpu_time() -> None:
    cal = replace(CAL, host_hidden=0.5)
    assert terms.exposed_host(1.0, 0.4, cal) == pytest.approx(0.8)
    assert terms.exposed_host(0.2, 1.0, cal) == pytest.approx(0.1)
    assert terms.exposed_host(1.0, 0.4, CAL) == 1.0


def test_text_only_leaves_the_vit_out(compose) -> None:
    """A decoder without a ViT (a text recipe): no ViT time, and no ViT parameters in the optimizer or the grads."""
    run, res = placed(compose, "gpus_per_node=1", "train.global_batch_size=8")
    w = workload(run, res).text_only()
    t = speed.predict(run, res, w, CAL)
    assert t.vision == 0 and t.vision_host == 0 and w.flops.vit == 0
    assert terms.trainable_split(run, res, 0, False)[0] == stage_params(run, res, 0).decoder_dense


def test_the_fitted_file_records_its_rows() -> None:
    """Every constant of the model is in calibration.json with the commit, the command and the rows it was fitted
    on; the held-out rows are other rows, and their median error is what the plan quotes."""
    src = calibration.source()
    cal = calibration.load()
    assert set(src["constants"]) == set(Calibration.names())
    s = src["source"]
    assert s["command"] == "vlmtrain lab calibrate-speed --fit" and s["commit"] != "unfitted"
    assert s["fit_rows"] and s["held_out_rows"] and not set(s["fit_rows"]) & set(s["held_out_rows"])
    assert s["held_out_median_abs_error_pct"] <= 20 and s["held_out_worst"]["name"] in s["held_out_rows"]
    assert all(v > 0 for k, v in cal.to_dict().items() if k != "host_hidden")


def test_a_partial_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"constants": {"vit_fraction": 0.3}, "source": {}}))
    with pytest.raises(ValueError, match="calibrate-speed --fit"):
        calibration.load(path)


def test_sweeper_table_shows_the_prediction(compose) -> None:
    """The -m sweeper's table ranks the valid jobs by predicted useful tokens/s/GPU (the model's own figures) and
    names the fastest; a skipped job gets none."""
    from hydra_plugins.vlmtrain_sweeper.vlmtrain_sweeper import SweepJob, summary_table

    jobs = []
    for i, gbs in enumerate((8, 16)):
        run, res = placed(compose, "gpus_per_node=1", f"train.global_batch_size={gbs}")
        jobs.append(SweepJob([f"train.global_batch_size={gbs}"], world="1 node x 1 GPU", num=i,
                             predicted=speed.predict(run, res, workload(run, res), CAL).to_dict()))
    jobs.append(SweepJob(["train.micro_batch_size=3"], valid=False, findings=["[error] x: y"], world="w"))
    fast = max(jobs[:2], key=lambda j: j.predicted["useful_tokens_per_s_per_gpu"])
    text = summary_table(jobs, Path("preflight.json"))
    line = next(ln for ln in text.splitlines() if ln.split()[:2] == [str(fast.num), fast.label])
    assert " #1 " in line and f"{fast.predicted['step_s']:.2f}s" in line
    assert f"fastest predicted: job {fast.num}, {fast.predicted['step_s']:.2f} s/step" in text
    assert "#" not in next(ln for ln in text.splitlines() if ln.lstrip().startswith("SKIP"))


def test_plan_prints_and_saves_the_models_figure(dry_run, tmp_path: Path, compose) -> None:
    """The dry-run plan's speed line is check.speed's prediction for the run as placed, and speed.json holds the
    same figures for the report."""
    from vlmtrain.check.defaults import placed as place

    overrides = ("model=tiny", "gpus_per_node=1", "train.global_batch_size=8")
    status, text = dry_run(*overrides, run_dir=tmp_path / "run")
    assert status == 0, text
    run = compose(*overrides, "dry_run=true", output_dir=str(tmp_path / "again"))
    _, res = place(run, 0)
    t = speed.predicted(run, res)
    assert f"speed:    predicted step {t.step_s:.2f} s, {t.useful_tokens_per_s_per_gpu:.0f} useful tokens/s/GPU" in text
    saved = speed.step.load(tmp_path / "run")
    assert saved is not None and saved.step_s == pytest.approx(t.step_s, rel=1e-3)
