"""Python frames in unusual places, run under the heap hook by
test_python_heap.py with the frames read in place (3.11+) and through the
public C API: both profiles must be the same. Every site keeps its blocks."""
import asyncio
import threading

keep = []


def gen(n):
  for i in range(n):
    keep.append(bytearray(1000 + i))  # a generator's frame, resumed from two callers
    yield i


def drive_a(g):
  return next(g)


def drive_b(g):
  return next(g)


def cells(n):
  box = [n]  # a cell: allocated in the frame's prologue (an incomplete frame)

  def inner():
    keep.append(bytearray(box[0]))
  inner()
  return inner


class Thing:
  def __init__(self, n):  # called from C (type.__call__): an eval loop of its own
    keep.append(bytearray(n))


def key(x):
  keep.append(bytearray(3000 + x))  # called back from sorted(), C
  return -x


def deep(n):
  if n == 0:
    keep.append(bytearray(4000))
    return
  deep(n - 1)


async def co(n):
  await asyncio.sleep(0)
  keep.append(bytearray(n))


def in_thread():
  keep.append(bytearray(5000))


def main():
  g = gen(4)
  drive_a(g)
  drive_b(g)
  drive_a(g)
  for n in range(3):
    keep.append(cells(2000 + n))
  for n in range(3):
    keep.append(Thing(2500 + n))
  sorted(range(5), key=key)
  deep(80)  # deeper than the frames kept (64)
  asyncio.run(co(6000))
  t = threading.Thread(target=in_thread)
  t.start()
  t.join()


main()
