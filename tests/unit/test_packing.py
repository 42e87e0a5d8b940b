"""data.packing=<capacity> on the real path: the data stage's bins (real realistic photos, the real processor),
vlmtrain's ConfigContainer -> Bridge's dataset provider -> Bridge's packed Qwen collate, the static row, and the
step counters that turn a batch into throughput."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from vlmtrain.build import container, target
from vlmtrain.check import preflight
from vlmtrain.config.resolve import resolve
from vlmtrain.train.step_counters import StepCounters

CAP = 4096
RUN = ["data=realistic", "data.payload.num_samples=16", "gpus_per_node=2", f"data.packing={CAP}",
       "train.global_batch_size=4"]


def _cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "packing-cache")


def _dataset(compose, tmp_path, cache: str, *overrides: str):
    """(run, finalized Bridge config, Bridge's train dataset) through Bridge's own dataset-provider lookup."""
    from megatron.bridge.data.utils import get_dataset_provider

    run = compose(*RUN, f"data.cache_dir={cache}", *overrides, output_dir=str(tmp_path))
    assert not preflight.errors(preflight.check(run, resolve(run)))
    res = resolve(run)
    cfg = container.build(run, res)
    target.finalize(run, res, cfg)  # Bridge's own validation, as the dry-run plan does
    train, _, _ = get_dataset_provider(cfg.dataset)([8, 0, 0], cfg.dataset)
    return run, cfg, train


def test_greedy_bins_keep_order_and_every_sample():
    from vlmtrain.data.bins import greedy_bins

    lengths = [900, 300, 2500, 100, 1000, 4000, 50, 50, 3900]
    bins = greedy_bins(lengths, 4096)
    assert [i for b in bins for i in b] == list(range(len(lengths)))  # data order, nothing dropped or split
    assert all(sum(lengths[i] for i in b) <= 4096 for b in bins)
    # greedy: each bin closed only because the next sample did not fit
    for b, nxt in zip(bins, bins[1:], strict=False):
        assert sum(lengths[i] for i in b) + lengths[nxt[0]] > 4096
    assert bins == [[0, 1, 2, 3], [4], [5, 6], [7, 8]]
    # segments padded to the alignment multiple are what must fit: 3 x 1366 aligned to 16 is 4128 > 4096
    assert greedy_bins([1365, 1365, 1365], 4096) == [[0, 1, 2]]
    assert greedy_bins([1365, 1365, 1365], 4096, align=16) == [[0, 1], [2]]


def test_too_long_sample_is_refused_naming_it():
    from vlmtrain.data.bins import SampleTooLong, greedy_bins
    from vlmtrain.data.scan import BadSample

    with pytest.raises(SampleTooLong) as err:
        greedy_bins([100, 5000, 200], 4096, names=["d: sample 0", "d: sample 1 (id x)", "d: sample 2"])
    msg = str(err.value)
    assert "d: sample 1 (id x)" in msg and "5000" in msg and "data.packing=4096" in msg and "at least 5000" in msg
    assert isinstance(err.value, BadSample)  # the plan and launcher stop on it as on a bad image: before GPU work


def test_too_long_sample_stops_the_data_stage(compose, tmp_path, tmp_path_factory):
    """On the real data: a capacity below the longest realistic sample fails in vlmtrain.data.prepare, naming it."""
    from vlmtrain.data import prepare
    from vlmtrain.data.bins import SampleTooLong

    run = compose(*RUN[:-2], "data.packing=1024", f"data.cache_dir={_cache(tmp_path_factory)}",
                  output_dir=str(tmp_path))
    with pytest.raises(SampleTooLong, match=r"realistic.*: sample \d+ \(id .*\) is \d+ tokens long but "
                                            r"data.packing=1024"):
        prepare.prepare(run, resolve(run))


def test_the_launcher_bins_cached_data_without_importing_megatron(compose, tmp_path, tmp_path_factory):
    """With the lengths cached, the launcher's data stage (train.py before torchrun) reads them and bins the data in
    a process that never imports Megatron, Bridge, transformers or torch: the ranks import them, the launcher
    need not pay for it a second time on every run."""
    import json
    import subprocess
    import sys

    from vlmtrain.data import prepare

    overrides = [*RUN, f"data.cache_dir={_cache(tmp_path_factory)}"]
    here = compose(*overrides, output_dir=str(tmp_path / "here"))
    want = prepare.prepare(here, resolve(here)).bins  # fills the cache
    code = (
        "import json, sys\n"
        "from vlmtrain.config.compose import compose\n"
        "from vlmtrain.config.resolve import resolve\n"
        "from vlmtrain.data import prepare\n"
        f"run = compose({overrides!r}, output_dir={str(tmp_path / 'launcher')!r})\n"
        "b = prepare.prepare(run, resolve(run)).bins\n"
        "heavy = [m for m in ('megatron', 'transformers', 'torch', 'transformer_engine') if m in sys.modules]\n"
        "print(json.dumps({'path': b.path, 'bins': b.bins, 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["heavy"] == []
    assert (got["path"], got["bins"]) == (want.path, want.bins) and len(want.bins) > 1


def test_lengths_are_what_the_collate_makes(compose, bridge, tmp_path, tmp_path_factory):
    """The data stage's length of every realistic sample equals the row Bridge's packed collate builds for it."""
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn

    from vlmtrain.data import bins, prepare

    run, cfg, train = _dataset(compose, tmp_path, _cache(tmp_path_factory))
    packed = bins.Bins.load(cfg.dataset.bins_file)
    examples = bins.bridge_examples(cfg.dataset.source)
    processor = bins.load_processor(str(prepare.processor_dir(run)))
    assert len(examples) == len(packed.lengths) == 16
    for e, n in zip(examples, packed.lengths, strict=True):
        assert qwen2_5_collate_fn([e], processor, enable_in_batch_packing=True)["input_ids"].shape[1] == n
    assert [i for b in packed.bins for i in b] == list(range(16))
    assert max(packed.bin_tokens()) <= CAP and 0 < packed.fill <= 1


def test_a_bin_collates_as_bridge_packs_its_samples(compose, bridge, tmp_path, tmp_path_factory):
    """One dataset item is one bin; its micro-batch is exactly Bridge's packed Qwen collate of the bin's samples,
    run through Bridge's vlm_step (Bridge sees micro_batch_size 1 and model.seq_length = the capacity)."""
    import torch
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
    from megatron.bridge.training import vlm_step

    from vlmtrain.config.groups import data
    from vlmtrain.data import bins, sample_ids

    run, cfg, train = _dataset(compose, tmp_path, _cache(tmp_path_factory))
    assert cfg.train.micro_batch_size == 1 and cfg.model.seq_length == CAP and not cfg.dataset.static
    assert data.forward_step(run) is vlm_step.forward_step
    packed = bins.Bins.load(cfg.dataset.bins_file)
    item = train[1]
    examples = bins.bridge_examples(cfg.dataset.source)
    assert item == [examples[i] for i in packed.bins[1]] and len(item) >= 2
    batch = train.collate_fn([item])
    ref = qwen2_5_collate_fn(item, train.processor, sequence_length=CAP, enable_in_batch_packing=True)
    assert batch.keys() == ref.keys() | {sample_ids.BATCH_KEY}  # and the row's sample ids, in row order
    assert batch[sample_ids.BATCH_KEY] == packed.bins[1]
    for key, value in ref.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(batch[key], value), key
    assert torch.equal(batch["visual_inputs"].pixel_values, ref["visual_inputs"].pixel_values)
    cu = batch["cu_seqlens_q"]
    assert (cu[1:] - cu[:-1]).tolist() == [packed.lengths[i] for i in packed.bins[1]]
    assert batch["input_ids"].shape == (1, packed.bin_tokens()[1])
    assert len(train) == 8 and train[len(packed.bins)] == train[0]  # Bridge's sample count wraps over the bins


def test_grid_only_mask_renders_build_bridge_s_rows(compose, bridge, tmp_path, tmp_path_factory, monkeypatch):
    """kernels.mask_grid_only: every bin's packed row is Bridge's, tensor for tensor (masks, labels, pixels, grids),
    while the image processor's full pixel work runs once per image instead of three times (the row's own pass;
    the assistant mask's two chat-template renders compute grids only)."""
    import torch
    from megatron.bridge.data.conversation_processing import _conversation_from_example
    from megatron.bridge.models.qwen_vl.data.collate_fn import qwen2_5_collate_fn
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    from vlmtrain.data import bins
    from vlmtrain.train import bridge_patches

    run, cfg, train = _dataset(compose, tmp_path, _cache(tmp_path_factory))
    packed = bins.Bins.load(cfg.dataset.bins_file)
    pixel_work: list[int] = []
    full = Qwen2VLImageProcessor._preprocess
    monkeypatch.setattr(Qwen2VLImageProcessor, "_preprocess",
                        lambda self, images, **kw: pixel_work.append(len(images)) or full(self, images, **kw))

    def rows() -> list[dict]:
        return [qwen2_5_collate_fn(train[i], train.processor, sequence_length=CAP, enable_in_batch_packing=True)
                for i in range(len(packed.bins))]

    refs, bridge_work = rows(), sum(pixel_work)
    pixel_work.clear()
    try:
        bridge_patches.install_mask_grid_only()
        got = rows()
    finally:
        bridge_patches.uninstall()
    images = sum(int(r["visual_inputs"].image_grid_thw.shape[0]) for r in refs)
    assert images > len(refs) and (bridge_work, sum(pixel_work)) == (3 * images, images)
    # Bridge's mask falls back to scanning the row's own ids when a render does not align, so equal rows alone
    # would not show equal renders: the render the mask makes (the processor's chat template, images included)
    # gives the same ids with grids only
    def render(example: dict) -> dict:
        return train.processor.apply_chat_template(_conversation_from_example(example), tokenize=True,
                                                   add_generation_prompt=False, return_dict=True,
                                                   return_assistant_tokens_mask=True)

    for example in bins.bridge_examples(cfg.dataset.source):
        want = render(example)
        with bridge_patches.grid_only(train.processor):
            ids = render(example)
        assert ids["input_ids"] == want["input_ids"] and ids["assistant_masks"] == want["assistant_masks"]
        assert torch.equal(ids["image_grid_thw"], want["image_grid_thw"]) and want["image_grid_thw"].shape[0] >= 1
    for ref, row in zip(refs, got, strict=True):
        assert row.keys() == ref.keys() and float(ref["loss_mask"].sum()) > 0
        for key, value in ref.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(row[key], value), key
        for key in ("pixel_values", "image_grid_thw"):
            assert torch.equal(getattr(row["visual_inputs"], key), getattr(ref["visual_inputs"], key)), key


def test_static_row_is_the_capacity_with_masked_counted_padding(compose, bridge, tmp_path, tmp_path_factory):
    import torch
    from megatron.bridge.data.datasets.utils import IGNORE_INDEX
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.rope import get_packed_seq_attention_mask
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    cache = _cache(tmp_path_factory)
    _, _, dynamic = _dataset(compose, tmp_path / "dynamic", cache)
    run, cfg, static = _dataset(compose, tmp_path / "static", cache, "data.packing_static=true")
    assert cfg.dataset.static
    item = static[1]
    real = dynamic.collate_fn([item])
    row = static.collate_fn([item])
    n = real["input_ids"].shape[1]
    assert row["input_ids"].shape == row["labels"].shape == row["loss_mask"].shape == (1, CAP) and n < CAP
    assert torch.equal(row["input_ids"][:, :n], real["input_ids"])
    assert torch.equal(row["cu_seqlens_q"], real["cu_seqlens_q"])  # the real samples' lengths are unchanged
    assert row["cu_seqlens_q_padded"][-1] == CAP and row["cu_seqlens_q_padded"][:-1].tolist() == \
        real.get("cu_seqlens_q_padded", real["cu_seqlens_q"])[:-1].tolist()
    assert (row["loss_mask"][0, n:] == 0).all() and (row["labels"][0, n:] == IGNORE_INDEX).all()
    assert (row["input_ids"][0, n:] == 0).all()
    # Bridge's Qwen3-VL model masks the tail out of attention from the same metadata
    params = get_packed_seq_params({k: row[k] for k in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded",
                                                         "cu_seqlens_kv_padded", "max_seqlen_q", "max_seqlen_kv")})
    assert int(get_packed_seq_attention_mask(row["input_ids"], params).sum()) == n

    def counts(r, batch):
        c = StepCounters(r, resolve(r), nullcontext)
        c.image_token_id = cfg.model.image_token_id
        c.count(batch)
        return c.totals

    c_real, c_static = counts(run, real), counts(run, row)
    assert c_static["padded_tokens"] == CAP and c_real["padded_tokens"] == n
    for key in ("nonpad_tokens", "samples", "image_tokens", "text_tokens", "loss_tokens", "images", "vit_patches"):
        assert c_static[key] == c_real[key], key
    assert c_static["nonpad_tokens"] == n


def test_graph_run_builds_a_static_capacity_row(compose, bridge, tmp_path, tmp_path_factory):
    """cuda_graph=moe_router_preprocess with a capacity: static rows forced, Bridge's TE graph helper will capture
    at model.seq_length = the capacity and micro_batch_size 1 (the shape every row has)."""
    run, cfg, train = _dataset(compose, tmp_path, _cache(tmp_path_factory), "cuda_graph=moe_router_preprocess")
    assert cfg.dataset.static and cfg.model.seq_length == CAP and cfg.train.micro_batch_size == 1
    assert cfg.model.cuda_graph_impl == "transformer_engine"
    assert train.collate_fn([train[0]])["input_ids"].shape == (1, CAP)


def test_packing_true_is_refused_naming_the_capacity(compose):
    with pytest.raises(Exception, match=r"data.packing is the capacity in tokens per micro-batch row, e.g. "
                                        r"data.packing=8192"):
        compose("data.packing=true")
    with pytest.raises(Exception, match="positive number of tokens"):
        compose("data.packing=0")
