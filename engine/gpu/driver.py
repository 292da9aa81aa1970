"""The CUDA driver's C ABI through ctypes: load a cubin, find its kernels and
launch them on torch's current stream. Kernels take raw pointers and scalars
only, so no compiled host-side binding is needed: the same code serves cubins
from nvcc and from NVRTC."""
from __future__ import annotations

import ctypes
import threading

_ARG = {"p": ctypes.c_uint64, "i": ctypes.c_int32, "l": ctypes.c_int64, "f": ctypes.c_float}


class CudaDriverError(RuntimeError):
    pass


class Driver:
    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaDriverError(f"no CUDA driver library: {e}") from None
        self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [
            ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._tls = threading.local()
        self._primary: dict[int, ctypes.c_void_p] = {}  # device -> its primary context (kept retained)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise CudaDriverError(f"{what}: {name.value.decode() if name.value else rc}")

    def ensure_context(self, device: int) -> None:
        """Make the device's primary context (the one torch uses) current on this thread."""
        if getattr(self._tls, "device", None) == device:
            return
        ctx = self._primary.get(device)
        if ctx is None:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self._primary[device] = ctx
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._tls.device = device

    def load_module(self, image: bytes) -> ctypes.c_void_p:
        mod = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(image, len(image))
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData")
        return mod

    def function(self, mod: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
        fn = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"cuModuleGetFunction({name})")
        return fn


def pack_args(name: str, sig: str, args) -> tuple[list, ctypes.Array]:
    """Kernel arguments as cuLaunchKernel takes them: an array of pointers to each value."""
    if len(args) != len(sig):
        raise TypeError(f"{name}: {len(sig)} arguments expected, {len(args)} given")
    vals = [_ARG[c](a) for c, a in zip(sig, args)]
    return vals, (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])


class Kernel:
    """One kernel with its argument signature ('p' pointer, 'i' int32, 'l' int64, 'f' float)."""

    def __init__(self, drv: Driver, fn: ctypes.c_void_p, name: str, sig: str):
        self.drv, self.fn, self.name, self.sig = drv, fn, name, sig

    def __call__(self, grid: tuple[int, ...], block: int, stream: int, *args) -> None:
        vals, ptrs = pack_args(self.name, self.sig, args)  # vals stay alive for the call
        g = tuple(grid) + (1,) * (3 - len(grid))
        if min(g) <= 0:
            return  # nothing to do
        rc = self.drv.lib.cuLaunchKernel(self.fn, g[0], g[1], g[2], block, 1, 1, 0, ctypes.c_void_p(stream), ptrs, None)
        self.drv.check(rc, f"launch {self.name}")


class EmulatedKernel:
    """The same kernel run by the CPU emulation library (csrc/cuda/dev/emu_lib.cpp):
    tests drive engine/gpu/cuda_kernels.py end to end on a machine without a GPU."""

    def __init__(self, lib: ctypes.CDLL, name: str, sig: str):
        self.lib, self.name, self.sig = lib, name, sig

    def __call__(self, grid: tuple[int, ...], block: int, stream: int, *args) -> None:
        vals, ptrs = pack_args(self.name, self.sig, args)
        g = tuple(grid) + (1,) * (3 - len(grid))
        if min(g) <= 0:
            return
        rc = self.lib.emu_call(self.name.encode(), g[0], g[1], block, ptrs)
        if rc == 1:
            raise RuntimeError(f"emulator has no kernel {self.name}")
        if rc != 0:  # the emulator printed the fault (a misaligned vector load)
            raise RuntimeError(f"{self.name} faulted on the emulator")
