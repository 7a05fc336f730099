// ProfileData, ProfilePlane, ProfileLine, ProfileEvent: jax.profiler's
// classes for reading a profile from code (xla/python/profiler), with their
// names and semantics, over the one model (model/xspace.h) read by the one
// reader (model/xspace_read.h).
//
// One model is shared (shared_ptr) by every object made from it; a plane,
// line or event object is a few pointers into it, made only when Python
// reaches it: `planes`, `lines`, `events` and `stats` are iterators, as in
// jax. Values as jax gives them:
//   start_ns  = float(offset_ps // 1000 (truncated) + line.timestamp_ns)
//   duration_ns = float(duration_ps // 1000), end_ns = start_ns + duration_ns
//   stats: (name, value) tuples; int64/uint64 -> int, double -> float,
//          str and bytes values -> str, a ref value -> the name it refers to.
// Where the file is malformed the model differs from jax's raw proto: a stat
// whose key has no metadata is left out (jax yields (None, None)), an event
// without metadata is named "(unknown event)" (jax: "").
// Errors are RuntimeErrors, as jax's: a file not found, not a profile,
// truncated, over 1 GiB; a text that is not an XSpace (jax logs and goes on).
#include "profile_data.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "export/xplane/xplane_writer.h"
#include "model/xspace.h"
#include "model/xspace_read.h"
#include "session/profiler_api_internal.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace spyglass::python {
namespace {

using SpacePtr = std::shared_ptr<const model::Space>;

// A new reference from the C API, or the Python error it set (MemoryError).
template <typename T = nb::object>
T Steal(PyObject* o) {
  if (o == nullptr) throw nb::python_error();
  return nb::steal<T>(o);
}

nb::str Str(std::string_view s) {
  // The model's names are valid UTF-8; a bytes stat value may not be.
  return Steal<nb::str>(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

nb::object StatValue(const model::Plane& plane, const model::Stat& s) {
  switch (s.kind) {
    case model::StatKind::kInt64: return Steal(PyLong_FromLongLong(s.i64));
    case model::StatKind::kUint64: return Steal(PyLong_FromUnsignedLongLong(s.u64));
    case model::StatKind::kDouble: return Steal(PyFloat_FromDouble(s.f64));
    case model::StatKind::kString:
    case model::StatKind::kBytes: return Str(plane.stat_str(s));
    case model::StatKind::kRef:
      return Str(s.ref < plane.stat_metadata().size() ? std::string_view(plane.stat_metadata()[s.ref].name)
                                                      : std::string_view());
  }
  return nb::none();
}

// A model and the Python objects made once for it: each event name is made a
// str once, then shared by every event of that name. Held by every object of
// the profile; released (with the GIL, as Python objects are) by the last.
struct Profile {
  explicit Profile(SpacePtr s) : space(std::move(s)), names(space->planes.size()) {}
  SpacePtr space;
  std::vector<std::vector<nb::object>> names;  // [plane][event metadata id]

  nb::object EventName(const model::Plane* plane, uint32_t id) {
    auto& n = names[static_cast<size_t>(plane - space->planes.data())];
    const auto& md = plane->event_metadata();
    if (id >= md.size()) return Str({});
    if (n.empty()) n.resize(md.size());
    if (!n[id].is_valid()) n[id] = Str(md[id].name);
    return n[id];
  }
};
using ProfilePtr = std::shared_ptr<Profile>;

struct ProfileEvent {
  ProfilePtr profile;
  const model::Plane* plane;
  const model::Line* line;
  const model::Event* event;

  double start_ns() const {
    // As jax: the offset truncated to ns, then added (wider, against overflow).
    return static_cast<double>(static_cast<__int128>(event->offset_ps / 1000) + line->timestamp_ns);
  }
  double duration_ns() const { return static_cast<double>(event->duration_ps / 1000); }
};

struct ProfileLine {
  ProfilePtr profile;
  const model::Plane* plane;
  const model::Line* line;
};

struct ProfilePlane {
  ProfilePtr profile;
  const model::Plane* plane;
};

struct ProfileData {
  ProfilePtr profile;
};

// Iterators of a profile's parts (tp_iternext without an exception at the
// end: a C++ throw per stat list would cost more than the list).
struct StatIterator {
  ProfilePtr profile;
  const model::Plane* plane;
  std::span<const model::Stat> stats;
  size_t next = 0;
  nb::object Next() {
    if (next >= stats.size()) return {};
    const model::Stat& s = stats[next++];
    return nb::make_tuple(Str(plane->stat_name(s)), StatValue(*plane, s));
  }
};

struct EventIterator {
  ProfilePtr profile;
  const model::Plane* plane;
  const model::Line* line;
  size_t next = 0;
  nb::object Next() {
    if (next >= line->events.size()) return {};
    return nb::cast(ProfileEvent{profile, plane, line, &line->events[next++]});
  }
};

struct LineIterator {
  ProfilePtr profile;
  const model::Plane* plane;
  size_t next = 0;
  nb::object Next() {
    if (next >= plane->lines.size()) return {};
    return nb::cast(ProfileLine{profile, plane, &plane->lines[next++]});
  }
};

struct PlaneIterator {
  ProfilePtr profile;
  size_t next = 0;
  nb::object Next() {
    const auto& planes = profile->space->planes;
    if (next >= planes.size()) return {};
    return nb::cast(ProfilePlane{profile, &planes[next++]});
  }
};

template <typename It>
PyObject* IterNext(PyObject* self) noexcept {
  try {
    return nb::inst_ptr<It>(self)->Next().release().ptr();  // null at the end: StopIteration
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyObject* IterSelf(PyObject* self) noexcept {
  Py_INCREF(self);
  return self;
}

template <typename It>
void BindIterator(nb::module_& m, const char* name) {
  static PyType_Slot slots[] = {{Py_tp_iter, reinterpret_cast<void*>(IterSelf)},
                                {Py_tp_iternext, reinterpret_cast<void*>(IterNext<It>)},
                                {0, nullptr}};
  nb::class_<It>(m, name, nb::type_slots(slots));
}

ProfileData Wrap(SpacePtr space) { return ProfileData{std::make_shared<Profile>(std::move(space))}; }

// os.fspath(path) as UTF-8 (str or os.PathLike, as open() takes).
std::string FsPath(nb::handle path) {
  nb::object p = Steal(PyOS_FSPath(path.ptr()));
  if (PyBytes_Check(p.ptr())) return std::string(PyBytes_AS_STRING(p.ptr()), PyBytes_GET_SIZE(p.ptr()));
  return nb::cast<std::string>(p);
}

ProfileData FromFile(nb::handle path) {
  std::string p = FsPath(path);
  auto space = std::make_shared<model::Space>();
  Status s;
  {
    nb::gil_scoped_release release;
    s = model::ReadXSpaceFile(p, space.get());
  }
  if (!s.ok()) RaiseRuntimeError(s);
  return Wrap(std::move(space));
}

ProfileData FromBytes(nb::bytes bytes) {
  auto space = std::make_shared<model::Space>();
  Status s;
  {
    // `bytes` is immutable and referenced by the caller while this runs.
    nb::gil_scoped_release release;
    s = model::ReadXSpaceBytes(std::string_view(bytes.c_str(), bytes.size()), space.get());
  }
  if (!s.ok()) RaiseRuntimeError(s);
  return Wrap(std::move(space));
}

ProfileData FromText(const std::string& text) {
  auto space = std::make_shared<model::Space>();
  Status s;
  {
    nb::gil_scoped_release release;
    s = model::ReadXSpaceText(text, space.get());
  }
  if (!s.ok()) RaiseRuntimeError(s);
  return Wrap(std::move(space));
}

nb::bytes TextToBytes(const std::string& text) {
  std::string out;
  Status s;
  {
    nb::gil_scoped_release release;
    s = model::XSpaceTextToBytes(text, &out);
  }
  if (!s.ok()) RaiseRuntimeError(s);
  return nb::bytes(out.data(), out.size());
}

}  // namespace

std::shared_ptr<const model::Space> SpaceOf(nb::handle profile_data) {
  return nb::cast<const ProfileData&>(profile_data).profile->space;
}

void BindProfileData(nb::module_& m) {
  BindIterator<StatIterator>(m, "_StatIterator");
  BindIterator<EventIterator>(m, "_EventIterator");
  BindIterator<LineIterator>(m, "_LineIterator");
  BindIterator<PlaneIterator>(m, "_PlaneIterator");

  nb::class_<ProfileEvent>(m, "ProfileEvent", "An event of a ProfileLine (jax.profiler.ProfileEvent).")
      .def_prop_ro("start_ns", &ProfileEvent::start_ns, "Start time of the event in nanoseconds.")
      .def_prop_ro("duration_ns", &ProfileEvent::duration_ns, "Duration of the event in nanoseconds.")
      .def_prop_ro(
          "end_ns", [](const ProfileEvent& e) { return e.start_ns() + e.duration_ns(); },
          "End time of the event in nanoseconds.")
      .def_prop_ro(
          "name", [](const ProfileEvent& e) { return e.profile->EventName(e.plane, e.event->metadata_id); },
          "Name of the event.")
      .def_prop_ro(
          "stats",
          [](const ProfileEvent& e) { return StatIterator{e.profile, e.plane, e.line->stats_of(*e.event)}; },
          "Stats of the event: an iterator of (name, value) tuples.");

  nb::class_<ProfileLine>(m, "ProfileLine", "A line (thread, stream) of a ProfilePlane (jax.profiler.ProfileLine).")
      .def_prop_ro("name", [](const ProfileLine& l) { return Str(l.line->name); }, "Name of the line.")
      .def_prop_ro(
          "events", [](const ProfileLine& l) { return EventIterator{l.profile, l.plane, l.line}; },
          "Events in the line: an iterator of ProfileEvent.");

  nb::class_<ProfilePlane>(m, "ProfilePlane", "A plane (host, device) of a ProfileData (jax.profiler.ProfilePlane).")
      .def_prop_ro("name", [](const ProfilePlane& p) { return Str(p.plane->name); }, "Name of the plane.")
      .def_prop_ro(
          "lines", [](const ProfilePlane& p) { return LineIterator{p.profile, p.plane}; },
          "Lines in the plane: an iterator of ProfileLine.")
      .def_prop_ro(
          "stats", [](const ProfilePlane& p) { return StatIterator{p.profile, p.plane, p.plane->stats}; },
          "Stats of the plane: an iterator of (name, value) tuples.");

  nb::class_<ProfileData>(m, "ProfileData",
                          "A profile read into memory (jax.profiler.ProfileData): a serialized XSpace, as in "
                          "<host>.xplane.pb files, or the last trace of a ProfileSession.")
      .def("__init__", [](ProfileData* d, nb::bytes b) { new (d) ProfileData(FromBytes(b)); })
      .def_static("from_file", &FromFile, "proto_file_path"_a,
                  "Creates a ProfileData from a serialized XSpace proto file (str or os.PathLike).")
      .def_static("from_serialized_xspace", &FromBytes, "serialized_xspace"_a,
                  "Creates a ProfileData from a serialized XSpace proto.")
      .def_static("from_text_proto", &FromText, "Creates a ProfileData from a text proto.")
      .def_static("text_proto_to_serialized_xspace", &TextToBytes, "Converts a text proto to a serialized XSpace.")
      .def_prop_ro(
          "planes", [](const ProfileData& d) { return PlaneIterator{d.profile}; },
          "Planes of the profile: an iterator of ProfilePlane.")
      .def(
          "find_plane_with_name",
          [](const ProfileData& d, std::string_view name) -> std::optional<ProfilePlane> {
            for (const model::Plane& p : d.profile->space->planes)
              if (p.name == name) return ProfilePlane{d.profile, &p};
            return std::nullopt;
          },
          "name"_a, "Finds the plane with the given name (None if there is none).");

  m.def("_last_trace_profile_data", []() -> std::optional<ProfileData> {
    SpacePtr space = session::LastTraceSpace();
    if (!space) return std::nullopt;
    return Wrap(std::move(space));
  });
  // jax's stop_and_get_fdo_profile and PGLEProfiler (profiler.py): stop
  // without writing the run, then hand the XSpace to XLA's converter.
  m.def("_stop_trace_in_memory", [] {
    Status s;
    {
      nb::gil_scoped_release release;
      s = session::StopTraceInMemory();
    }
    if (!s.ok()) RaiseRuntimeError(s);
  });
  m.def("_serialize_xspace", [](nb::handle data) {
    std::string bytes;
    {
      std::shared_ptr<const model::Space> space = SpaceOf(data);
      nb::gil_scoped_release release;
      bytes = exporter::SerializeXSpace(*space);
    }
    return nb::bytes(bytes.data(), bytes.size());
  }, "profile_data"_a, "The ProfileData as a serialized XSpace (what jaxlib's ProfilerSession.stop returns).");
}

}  // namespace spyglass::python
