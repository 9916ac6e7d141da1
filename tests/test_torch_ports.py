"""Code ported from Horovod or BytePS: their spellings of DistributedOptimizer,
broadcast_parameters, broadcast_optimizer_state and compression run on labkv,
or are refused naming labkv's spelling (``labkv/torch/_ported_spellings.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import labkv  # noqa: E402
import labkv.torch as lkt  # noqa: E402
from tests.test_torch import _data, _mlp, _train, _unchanged  # noqa: E402


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_horovods_positional_named_parameters_train_as_labkvs_keyword():
    model, kv = _mlp(), labkv.create()
    opt = lkt.DistributedOptimizer(_sgd(model), model.named_parameters(), kv)
    assert opt.names == ["0.weight", "0.bias", "2.weight", "2.bias"] and opt.kvstore is kv
    ported = _train(model, opt, *_data())
    model = _mlp()
    opt = lkt.DistributedOptimizer(
        _sgd(model), labkv.create(), named_parameters=model.named_parameters()
    )
    labkvs = _train(model, opt, *_data())
    assert all(torch.equal(a, b) for a, b in zip(ported, labkvs, strict=True))


def test_horovods_call_without_a_store_is_refused_with_labkvs_signature():
    model = _mlp()
    values = [p.clone() for p in model.parameters()]
    with pytest.raises(TypeError) as info:
        lkt.DistributedOptimizer(_sgd(model), model.named_parameters())
    message = str(info.value)
    assert message.startswith("DistributedOptimizer(optimizer, kvstore=None, named_parameters=")
    assert "the second argument was named_parameters (Horovod's and BytePS's second" in message
    assert "DistributedOptimizer(opt, kv, named_parameters=model.named_parameters())" in message
    with pytest.raises(
        TypeError, match="needs the store the values go through, and none was given"
    ):
        lkt.DistributedOptimizer(_sgd(model))
    kv = labkv.create()
    with pytest.raises(TypeError, match="named_parameters given twice"):
        lkt.DistributedOptimizer(
            _sgd(model), list(model.named_parameters()), named_parameters=model.named_parameters()
        )
    with pytest.raises(TypeError, match="kvstore must be a labkv store .*got str"):
        lkt.DistributedOptimizer(_sgd(model), "dist_sync")
    _unchanged(model, kv, values)
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def test_broadcasts_accept_root_rank_0_and_refuse_another_root_naming_why():
    model, kv = _mlp(), labkv.create()
    lkt.broadcast_parameters(model.state_dict(), kv, root_rank=0)
    assert kv.keys() == ["0.weight", "0.bias", "2.weight", "2.bias"]
    opt = _sgd(model)
    _train(model, opt, *_data(), steps=1)
    lkt.broadcast_optimizer_state(opt, kv, root_rank=0)
    assert any(k.startswith("optimizer_state.") for k in kv)

    fresh, other = _mlp(1), labkv.create()
    for call, arg in (
        (lkt.broadcast_parameters, fresh.state_dict()),
        (lkt.broadcast_optimizer_state, _sgd(fresh)),
    ):
        name = call.__name__
        with pytest.raises(ValueError, match=rf"{name}\(root_rank=1\): .*root_rank must be 0"):
            call(arg, other, root_rank=1)
        with pytest.raises(ValueError, match=r"root_rank=2\): labkv broadcasts the values of the"):
            call(arg, 2)  # Horovod's (x, root_rank) positional form
        with pytest.raises(
            TypeError, match=rf"{name}\(.*needs the store .*{name}\(.*, kv, root_rank=0\)"
        ):
            call(arg, root_rank=0)  # Horovod's call passes no store
        with pytest.raises(TypeError, match=rf"{name}\(.*needs the store"):
            call(arg, 0)
        with pytest.raises(TypeError, match=r"root_rank must be an int \(0\), got '0'"):
            call(arg, other, root_rank="0")
    assert other.keys() == []


class _HorovodFP16:  # stands for horovod.torch.compression.FP16Compressor, by its names
    pass


class _HorovodNone:
    pass


_HorovodFP16.__module__ = _HorovodNone.__module__ = "horovod.torch.compression"
_HorovodFP16.__name__, _HorovodNone.__name__ = "FP16Compressor", "NoneCompressor"


@pytest.mark.parametrize("none", [lkt.Compression.none, _HorovodNone], ids=["labkv", "horovod"])
def test_compression_none_is_no_compression(none):
    model, kv = _mlp(), labkv.create()
    opt = lkt.DistributedOptimizer(_sgd(model), kv, model.named_parameters(), compression=none)
    assert kv._compression is None
    _train(model, opt, *_data(), steps=2)


@pytest.mark.parametrize("fp16", [lkt.Compression.fp16, _HorovodFP16], ids=["labkv", "horovod"])
def test_compression_fp16_is_refused_naming_the_compression_labkv_has(fp16):
    model, kv = _mlp(), labkv.create()
    values = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"no float16 compression .*\{'type': '2bit'"):
        lkt.DistributedOptimizer(_sgd(model), kv, model.named_parameters(), compression=fp16)
    with pytest.raises(TypeError, match=r"compression must be MXNet's dict .*got '2bit'"):
        lkt.DistributedOptimizer(_sgd(model), kv, model.named_parameters(), compression="2bit")
    _unchanged(model, kv, values)


def test_the_readme_maps_ddp_horovod_and_byteps_calls_to_labkvs():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("| DDP (`torch.distributed`) | Horovod | BytePS | labkv |", 1)[1]
    table = table.split("\n\n", 1)[0]
    for call in (
        "hvd.DistributedOptimizer(opt, model.named_parameters())",
        "hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
        "hvd.broadcast_optimizer_state(opt, root_rank=0)",
        "hvd.Compression.fp16",
        "DistributedDataParallel(model)",
        "bps.DistributedOptimizer",
    ):
        assert call in table, call
