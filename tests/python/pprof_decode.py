"""A small pprof decoder for the tests (profile.proto field numbers): what
the memory profiles hold, read without the code that wrote them."""
import gzip


def _varint(b, i):
  v = shift = 0
  while True:
    c = b[i]
    i += 1
    v |= (c & 0x7F) << shift
    shift += 7
    if c < 0x80:
      return v, i


def _fields(b):
  i = 0
  while i < len(b):
    tag, i = _varint(b, i)
    field, wire = tag >> 3, tag & 7
    if wire == 0:
      v, i = _varint(b, i)
    elif wire == 2:
      n, i = _varint(b, i)
      v, i = b[i:i + n], i + n
    else:
      raise AssertionError(f"wire type {wire}")
    yield field, wire, v


def _ints(wire, v):
  if wire == 0:
    return [v]
  out, i = [], 0
  while i < len(v):
    x, i = _varint(v, i)
    out.append(x)
  return out


def parse_profile(data):
  """[{'frames': [(function, file, line)], 'count', 'bytes', 'labels'}], leaf first."""
  raw = gzip.decompress(data)
  strings, samples, locations, functions = [], [], {}, {}
  for field, wire, v in _fields(raw):
    if field == 2:
      samples.append(v)
    elif field == 4:
      loc_id, lines = 0, []
      for f, w, x in _fields(v):
        if f == 1:
          loc_id = x
        elif f == 4:
          d = {f2: x2 for f2, _, x2 in _fields(x)}
          lines.append((d.get(1, 0), d.get(2, 0)))
      locations[loc_id] = lines
    elif field == 5:
      d = {f: x for f, _, x in _fields(v)}
      functions[d[1]] = (d.get(2, 0), d.get(4, 0))
    elif field == 6:
      strings.append(v.decode())
  out = []
  for s in samples:
    locs, values, labels = [], [], {}
    for f, w, x in _fields(s):
      if f == 1:
        locs += _ints(w, x)
      elif f == 2:
        values += _ints(w, x)
      elif f == 3:
        d = {f2: x2 for f2, _, x2 in _fields(x)}
        labels[strings[d[1]]] = strings[d.get(2, 0)]
    frames = []
    for loc in locs:
      for fn_id, line in locations[loc]:
        name, file = functions[fn_id]
        frames.append((strings[name], strings[file], line))
    out.append({"frames": frames, "count": values[0], "bytes": values[1], "labels": labels})
  return out
