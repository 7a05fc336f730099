#include "server/options_convert.h"

#include <limits>

namespace spyglass::server {

tensorflow::ProfileOptions ToProto(const profiler::ProfileOptions& o) {
  tensorflow::ProfileOptions p;
  p.set_version(1);
  p.set_device_type(tensorflow::ProfileOptions::UNSPECIFIED);
  p.set_include_dataset_ops(o.include_dataset_ops);
  p.set_host_tracer_level(static_cast<uint32_t>(o.host_tracer_level));
  p.set_device_tracer_level(static_cast<uint32_t>(o.device_tracer_level));
  p.set_python_tracer_level(static_cast<uint32_t>(o.python_tracer_level));
  p.set_enable_hlo_proto(o.enable_hlo_proto);
  p.set_start_timestamp_ns(o.start_timestamp_ns);
  p.set_duration_ms(o.duration_ms);
  p.set_repository_path(o.repository_path);
  p.set_raise_error_on_start_failure(o.raise_error_on_start_failure);
  p.set_session_id(o.session_id);
  auto& adv = *p.mutable_advanced_configuration();
  for (const auto& [k, v] : o.advanced_configuration) {
    tensorflow::ProfileOptions::AdvancedConfigValue cv;
    if (v.is_bool()) cv.set_bool_value(v.as_bool());
    else if (v.is_int()) cv.set_int64_value(v.as_int());
    else cv.set_string_value(v.as_string());
    adv[k] = cv;
  }
  return p;
}

profiler::ProfileOptions FromProto(const tensorflow::ProfileOptions& p) {
  profiler::ProfileOptions o;
  o.include_dataset_ops = p.include_dataset_ops();
  o.duration_ms = p.duration_ms();
  o.start_timestamp_ns = p.start_timestamp_ns();
  o.session_id = p.session_id();
  o.repository_path = p.repository_path();
  if (p.version() == 0) return o;  // defaults, as the reference server
  auto level = [](uint32_t v) { return v > 1000 ? 1000 : static_cast<int>(v); };  // validated later
  o.host_tracer_level = level(p.host_tracer_level());
  o.device_tracer_level = level(p.device_tracer_level());
  o.python_tracer_level = level(p.python_tracer_level());
  o.enable_hlo_proto = p.enable_hlo_proto();
  o.raise_error_on_start_failure = p.raise_error_on_start_failure();
  for (const auto& [k, v] : p.advanced_configuration()) {
    switch (v.value_case()) {
      case tensorflow::ProfileOptions::AdvancedConfigValue::kBoolValue:
        o.advanced_configuration.insert_or_assign(k, profiler::AdvancedValue(v.bool_value()));
        break;
      case tensorflow::ProfileOptions::AdvancedConfigValue::kInt64Value:
        o.advanced_configuration.insert_or_assign(k, profiler::AdvancedValue(v.int64_value()));
        break;
      case tensorflow::ProfileOptions::AdvancedConfigValue::kStringValue:
        o.advanced_configuration.insert_or_assign(k, profiler::AdvancedValue(v.string_value()));
        break;
      default: break;
    }
  }
  return o;
}

}  // namespace spyglass::server
