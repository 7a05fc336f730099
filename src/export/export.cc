#include "export/export.h"

#include "sampling/cpu_model.h"

#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"

namespace spyglass::exporter {
namespace {

struct FormatSpec {
  Format format;
  const char* suffix;  // after "<host>", or the whole name when per_host is false
  bool per_host;
  Status (*write)(const model::Space& space, const OutputDir& dir, const std::string& name,
                  const ExportRequest& request);
  std::string ExportedFiles::*path;
};

Status WriteXPlane(const model::Space& space, const OutputDir& dir, const std::string& name,
                   const ExportRequest& request) {
  if (!request.xplane_bytes.empty()) return dir.WriteBytes(name, request.xplane_bytes);
  return WriteXSpaceFile(space, dir, name);
}

Status WriteTraceJson(const model::Space& space, const OutputDir& dir, const std::string& name,
                      const ExportRequest&) {
  return WriteTraceJsonGz(space, dir, name);
}

Status WritePerfettoTraceJson(const model::Space& space, const OutputDir& dir, const std::string& name,
                              const ExportRequest&) {
  TraceJsonOptions json;
  json.perfetto = true;
  return WriteTraceJsonGz(space, dir, name, json);
}

constexpr FormatSpec kFormats[] = {
    {Format::kXPlane, ".xplane.pb", true, WriteXPlane, &ExportedFiles::xplane},
    {Format::kTraceJson, ".trace.json.gz", true, WriteTraceJson, &ExportedFiles::trace_json},
    {Format::kPerfettoTraceJson, "perfetto_trace.json.gz", false, WritePerfettoTraceJson,
     &ExportedFiles::perfetto_trace},
};

const FormatSpec& SpecOf(Format format) {
  for (const FormatSpec& f : kFormats)
    if (f.format == format) return f;
  return kFormats[0];  // unreachable: every Format has an entry
}

}  // namespace

std::string FileNameOf(Format format, const std::string& host) {
  const FormatSpec& f = SpecOf(format);
  return f.per_host ? host + f.suffix : f.suffix;
}

Status Export(const model::Space& space, const OutputDir& dir, const ExportRequest& request, ExportedFiles* files) {
  for (Format format : request.formats) {
    const FormatSpec& f = SpecOf(format);
    if (f.per_host && !IsPlainComponent(request.host))
      return InvalidArgumentError("cannot name the output of host '" + request.host + "'");
    const std::string name = FileNameOf(format, request.host);
    if (Status s = f.write(space, dir, name, request); !s.ok()) return s;
    files->*f.path = dir.PathOf(name);
  }
  // Beside a host's files: each process's CPU samples as a pprof profile,
  // from the model (a capture client exports the XSpace as received, then
  // the JSON from the model it decoded: the profile comes with the latter).
  bool per_host = false;
  for (Format format : request.formats) per_host |= format == Format::kXPlane || format == Format::kTraceJson;
  if (per_host)
    if (Status s = sampling::WriteCpuProfiles(space, dir, &files->cpu_profiles); !s.ok()) return s;
  return Status::Ok();
}

}  // namespace spyglass::exporter
