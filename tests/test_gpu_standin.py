"""The CuPy stand-in is as strict as CuPy where CuPy is strict (the rules the GPU
tests rely on to catch device bugs on a machine without a GPU)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests._standin import rotated, standin_cupy


@pytest.fixture
def cp():
    with standin_cupy(physical=2) as module:
        yield module


def on(cp, device, make):
    with cp.cuda.Device(device):
        return make()


def test_arrays_are_made_on_the_current_device_and_remember_it(cp):
    a = on(cp, 1, lambda: cp.ones(3, dtype=cp.float32))
    assert a.device.id == 1 and cp.zeros(2).device.id == 0
    assert on(cp, 1, lambda: cp.zeros_like(cp.zeros(2))).device.id == 1
    assert a.copy().device.id == 0  # copies land on the current device, as in CuPy
    assert a.reshape(3, 1).device.id == 1  # a view stays where it is


@pytest.mark.parametrize(
    "kernel",
    [
        lambda a, b: a + b,
        lambda a, b: a.sum(),
        lambda a, b: __import__("cupy").vdot(a, a),
        lambda a, b: a.astype("float64"),
        lambda a, b: __import__("cupy").where(a > 0, a, b),
    ],
)
def test_a_kernel_with_an_operand_off_the_current_device_raises(cp, kernel):
    a = on(cp, 1, lambda: cp.ones(3))
    b = cp.ones(3)
    with pytest.raises(ValueError, match="array device = 1 while current = 0"):
        kernel(a, b)
    with pytest.raises(ValueError, match="array device = 0 while current = 1"):
        on(cp, 1, lambda: kernel(b, a))


def test_a_new_thread_starts_on_device_0(cp):
    a = on(cp, 1, lambda: cp.ones(3))
    errors = []

    def work():
        try:
            a.min()
        except ValueError as exc:
            errors.append(exc)

    with cp.cuda.Device(1):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert len(errors) == 1


def test_set_needs_exact_dtype_shape_and_a_contiguous_destination(cp):
    a = cp.zeros((2, 3), dtype=cp.float32)
    with pytest.raises(ValueError, match="Shape mismatch"):
        a.set(np.ones(6, np.float32))
    with pytest.raises(TypeError, match="cannot be set"):
        a.set(np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="non-contiguous"):
        a[:, ::2].set(np.ones((2, 2), np.float32))
    a.set(np.full((2, 3), 7, np.float32))
    np.testing.assert_array_equal(a.get(), 7)


def test_no_implicit_conversion_to_or_mixing_with_numpy(cp):
    a = cp.ones(3)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError):
        a + np.ones(3)
    with pytest.raises(TypeError):
        np.copyto(np.zeros(3), a)
    assert float(cp.ones(())) == 1.0  # size-1 arrays do convert to Python scalars


def test_cuda_visible_devices_rotation_maps_ordinals_to_physical_gpus():
    assert rotated(1, 4) == "1,2,3,0"
    with standin_cupy(physical=4, visible=rotated(1, 4)) as cp:
        assert cp.cuda.runtime.getDeviceCount() == 4
        ids = [cp.cuda.Device(i).pci_bus_id for i in range(4)]
    with standin_cupy(physical=4) as cp:
        plain = [cp.cuda.Device(i).pci_bus_id for i in range(4)]
    assert ids == plain[1:] + plain[:1] and len(set(ids)) == 4
    with standin_cupy(physical=2, visible="1") as cp:
        assert cp.cuda.runtime.getDeviceCount() == 1
        with pytest.raises(cp.CUDARuntimeError):
            cp.cuda.Device(1).use()
    with standin_cupy(physical=2) as cp:
        cp.configure(2, "")  # set but empty: CUDA sees no GPU
        assert cp.cuda.runtime.getDeviceCount() == 0 and not cp.cuda.is_available()


def test_servers_of_a_dask_cuda_worker_use_its_own_gpu(monkeypatch):
    from labkv import gpu
    from labkv.cluster._device import device_label, pick_server_device

    with standin_cupy(physical=4) as cp:
        physical_3 = cp.cuda.Device(3).pci_bus_id
        # no CUDA_VISIBLE_DEVICES: every worker sees every GPU; one per server
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        assert [pick_server_device("gpu", s) for s in range(5)] == [gpu(i % 4) for i in range(5)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", rotated(3, 4))  # dask-cuda's worker 3
    with standin_cupy(physical=4, visible=rotated(3, 4)):
        for option in ("gpu", "auto"):
            devices = [pick_server_device(option, s) for s in range(4)]
            assert devices == [gpu(0)] * 4
            assert device_label(devices[0]) == f"gpu(0) pci:{physical_3}"
        assert pick_server_device("gpu(2)", 0) == gpu(2)  # told otherwise


def test_a_float_scalar_beside_a_float16_array_is_typed_by_its_value(cp):
    # CuPy (through v13) runs float16 + np.float32(1e-8) as a float16 kernel: the
    # scalar becomes 0 there (numpy 2 would promote the kernel to float32)
    half = cp.zeros(2, dtype=cp.float16)
    assert (half + np.float32(1e-8)).dtype == np.float16
    assert (half + np.float32(1e-8)).get().tolist() == [0.0, 0.0]
    assert (half + 1e5).dtype == np.float32  # too big for float16: a float32 kernel
    single = half.astype(cp.float32) + np.float32(1e-8)
    assert single.dtype == np.float32 and single.get()[0] == np.float32(1e-8)
    assert cp.where(half > 0, half, np.float32(1e-8)).dtype == np.float16


class _Producer:
    """A DLPack producer on CUDA device ``device`` (its memory a numpy array here)
    that notes the current device and the stream it was asked with."""

    def __init__(self, cp, data, device, dev_type=2):
        self.cp, self.data, self.device, self.dev_type, self.asked = cp, data, device, dev_type, []

    def __dlpack_device__(self):
        return (self.dev_type, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, copy=None):
        self.asked.append((self.cp.cuda.runtime.getDevice(), stream))
        return self.data.__dlpack__(max_version=max_version)


def test_from_dlpack_shares_a_cuda_producers_memory_on_its_device(cp):
    data = np.arange(3, dtype=np.float32)
    producer = _Producer(cp, data, device=1)
    a = cp.from_dlpack(producer)
    assert a.device.id == 1 and a.dtype == np.float32
    assert producer.asked == [(1, 1)]  # its device current, CuPy's legacy default stream
    assert cp.cuda.runtime.getDevice() == 0  # and the previous device current again
    with cp.cuda.Device(1):
        a += 1  # a kernel on device 1 writes the producer's memory
    np.testing.assert_array_equal(data, [1, 2, 3])
    with pytest.raises(ValueError, match="array device = 1 while current = 0"):
        a.sum()


def test_from_dlpack_refuses_cpu_producers_bare_capsules_and_unseen_devices(cp):
    data = np.zeros(2, np.float32)
    with pytest.raises(TypeError, match="CPU arrays cannot be directly imported to CuPy"):
        cp.from_dlpack(data)
    with pytest.raises(TypeError, match="no bare DLPack capsules"):
        cp.from_dlpack(data.__dlpack__())
    with pytest.raises(cp.CUDARuntimeError, match="invalid device ordinal"):
        cp.from_dlpack(_Producer(cp, data, device=2))
    with pytest.raises(TypeError, match="Unsupported array type: 8"):
        cp.from_dlpack(_Producer(cp, data, device=0, dev_type=8))
