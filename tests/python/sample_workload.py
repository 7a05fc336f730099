"""The known Python workload of the sampling tests: burn_a, burn_b, burn_c
take about 50/30/20 of the process's CPU time, on two threads, the second
partly asleep; squeeze() spends its time in zlib (native code under a Python
frame). Prints each function's measured share of the CPU time (thread CPU
time around each call), "name share" per line: the truth the profile is
checked against.

  python sample_workload.py [SECONDS]
"""
import sys
import threading
import time
import zlib

QUANTUM = 0.01  # CPU seconds per call
cpu = {"burn_a": 0.0, "burn_b": 0.0, "burn_c": 0.0, "squeeze": 0.0}
lock = threading.Lock()


def spin(budget):
  end = time.thread_time() + budget
  x = 0
  while time.thread_time() < end:
    for i in range(200):
      x += i * i
  return x


def burn_a():
  return spin(QUANTUM)


def burn_b():
  return spin(QUANTUM)


def burn_c():
  return spin(QUANTUM)


DATA = bytes(range(256)) * 4096


def squeeze():
  end = time.thread_time() + QUANTUM
  while time.thread_time() < end:
    zlib.compress(DATA, 9)


def timed(fn):
  t = time.thread_time()
  fn()
  with lock:
    cpu[fn.__name__] += time.thread_time() - t


def main_thread_work(deadline):
  # 50 (a) : 10 (squeeze) of the total, interleaved.
  while time.monotonic() < deadline:
    for _ in range(5):
      timed(burn_a)
    timed(squeeze)


def second_thread_work(deadline):
  # 30 (b) : 10 (c) with naps: this thread is partly asleep.
  while time.monotonic() < deadline:
    for _ in range(3):
      timed(burn_b)
    timed(burn_c)
    time.sleep(0.005)


def main():
  seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
  deadline = time.monotonic() + seconds
  t = threading.Thread(target=second_thread_work, args=(deadline,), name="second")
  t.start()
  main_thread_work(deadline)
  t.join()
  total = sum(cpu.values())
  for name, v in cpu.items():
    print(f"{name} {v / total:.4f}")
  print(f"cpu_seconds {time.process_time():.4f}")


if __name__ == "__main__":
  main()
