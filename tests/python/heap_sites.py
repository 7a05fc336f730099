"""Known allocation sites, run unmodified under the heap hook by
test_python_heap.py (with several Pythons, and with memray as the peer)."""
import ctypes

try:
  import numpy
except ImportError:  # not every Python of the machine has it
  numpy = None

keep = [None] * 64  # sized once: no list growth at the sites below


def make_bytearrays(n, size):
  for i in range(n):
    keep[i] = bytearray(size)  # SITE bytearray


def make_native(n, size):
  libc = ctypes.PyDLL(None)  # a native call that keeps the GIL
  libc.malloc.restype = ctypes.c_void_p
  libc.malloc.argtypes = [ctypes.c_size_t]
  for i in range(n):
    keep[32 + i] = libc.malloc(size)  # SITE native


def make_each_domain():
  api = ctypes.pythonapi  # CPython's allocator API itself, one block per domain
  for name in ("PyMem_RawMalloc", "PyMem_Malloc", "PyObject_Malloc"):
    getattr(api, name).restype = ctypes.c_void_p
    getattr(api, name).argtypes = [ctypes.c_size_t]
  keep[40] = api.PyMem_RawMalloc(111_111)  # SITE raw
  keep[41] = api.PyMem_Malloc(222_222)  # SITE mem
  keep[42] = api.PyObject_Malloc(333_333)  # SITE obj


def make_numpy(n, size):
  for i in range(n):
    keep[48 + i] = numpy.ones(size)  # SITE numpy


def make_temporary(n):
  for _ in range(n):
    x = bytearray(50_000)  # SITE temporary
    del x


def main():
  make_bytearrays(10, 100_000)
  make_native(3, 777_777)
  make_each_domain()
  if numpy is not None:
    make_numpy(4, 100_000)
  make_temporary(20)


main()
